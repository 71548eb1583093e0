// Command netdelay forwards TCP connections from -listen to -to and holds
// every chunk for -delay in each direction: a network between an
// authority and its PostgreSQL, on one machine, so that a change in the
// round trips a request makes shows in its latency
// (docs/performance.md, "Round trips per request").
//
//	go run ./netdelay -listen 127.0.0.1:55472 -to 127.0.0.1:55471 -delay 500us
//
// Chunks are delayed, not throttled: many can be in flight at once, and each
// leaves in order once its delay has passed.
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"time"
)

type chunk struct {
	b   []byte
	due time.Time
}

// forward copies src to dst, each chunk no sooner than delay after it was
// read, and half-closes dst when src ends.
func forward(dst net.Conn, src io.Reader, delay time.Duration) {
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	for range ch {
		// Drain, so the reader is never left blocked on a full channel.
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// serve accepts connections on l until it is closed, joining each to a
// new connection to upstream through two delayed forwards.
func serve(l net.Listener, upstream string, delay time.Duration) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				log.Printf("netdelay: %v", err)
				return
			}
			defer u.Close()
			done := make(chan struct{})
			go func() { forward(u, c, delay); close(done) }()
			forward(c, u, delay)
			<-done
		}()
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:55472", "address to accept connections on")
	to := flag.String("to", "127.0.0.1:55471", "address to forward them to")
	delay := flag.Duration("delay", 500*time.Microsecond, "delay in each direction (a round trip is twice this)")
	flag.Parse()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(serve(l, *to, *delay))
}
