package authority

// apart runs f on a goroutine of its own and waits for it to return.
//
// An agent stream holds two goroutines of ours for its whole life (the
// handler and its receive loop), idle almost all of it. A goroutine's
// stack grows to the deepest call it has made — a store query through
// SQLite, a certificate chain check — and the collector gives it back only
// by halves, only while less than a quarter is in use, and only at a
// collection, which an idle authority rarely runs: with the work done
// inline, 2,000 open streams held 37 KiB of stack each (measured with gdb
// over runtime.allgs, docs/performance.md), 25 KiB with it done apart.
// Work done apart grows a short-lived
// goroutine's stack, which returns to the runtime's pool when f returns;
// the stream's own goroutines stay at the few KiB their waits need. The
// cost is one goroutine start per call (about a microsecond), beside a
// store round trip.
//
// A panic in f panics the caller with it (a panicked, with f's stack), so
// the handler's recovery answers it as it would one of its own.
func apart(f func()) {
	done := make(chan error, 1)
	go func() {
		var p error
		defer func() { done <- p }()
		defer catch(&p)
		f()
	}()
	if p := <-done; p != nil {
		panic(p)
	}
}
