package listener

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// acceptAll accepts on lis until it is closed, handing over each
// connection.
func acceptAll(lis net.Listener) <-chan net.Conn {
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	return accepted
}

// dialTo returns a dialler of addr whose connections close when the test
// ends.
func dialTo(t *testing.T, addr string) func() net.Conn {
	return func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// closedAtOnce reports whether the server closed c within d, having sent
// nothing.
func closedAtOnce(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF
}

// refusals records what a listener reports refused, from its accepting
// goroutine.
type refusals struct {
	mu  sync.Mutex
	got []Refusal
}

func (r *refusals) add(x Refusal) {
	r.mu.Lock()
	r.got = append(r.got, x)
	r.mu.Unlock()
}

func (r *refusals) all() []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Refusal(nil), r.got...)
}
