package psk

import (
	"testing"
	"time"
)

func TestCheckGrace(t *testing.T) {
	for _, tc := range []struct {
		grace time.Duration
		ok    bool
	}{
		{0, true},
		{DefaultGrace, true},
		{MaxGrace, true},
		{-time.Second, false},
		{MaxGrace + time.Second, false},
	} {
		if err := CheckGrace(tc.grace); (err == nil) != tc.ok {
			t.Errorf("CheckGrace(%s) = %v, want ok %v", tc.grace, err, tc.ok)
		}
	}
}
