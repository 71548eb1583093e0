package sqlite

import (
	"database/sql"
	"fmt"
	"reflect"
	"testing"
)

// TestAssignMatchesReflect: assign's typed cases store what assignReflect
// (and, for nullInt, sql.NullInt64) stores, and fail where it fails, for
// every destination type the scan functions use and every value the
// driver gives (TEXT, BLOB, INTEGER, NULL, and a REAL that none takes).
func TestAssignMatchesReflect(t *testing.T) {
	srcs := []any{"text", "", []byte("blob"), []byte{}, int64(42), int64(0), int64(-7), nil, 1.5}
	dsts := []func() any{
		func() any { s := "before"; return &s },
		func() any { b := []byte("before"); return &b },
		func() any { i := int64(99); return &i },
		func() any { i := 99; return &i },
		func() any { b := true; return &b },
		func() any { return &sql.NullInt64{Int64: 99, Valid: true} },
	}
	for _, src := range srcs {
		for _, mk := range dsts {
			want, got := mk(), mk()
			werr := assignReflect(want, src)
			gerr := assign(got, src)
			name := fmt.Sprintf("%T<-%#v", want, src)
			if (werr == nil) != (gerr == nil) {
				t.Errorf("%s: assign error %v, assignReflect error %v", name, gerr, werr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: assign stored %#v, assignReflect %#v", name, got, want)
			}
		}
		var n nullInt
		n.Int64, n.Valid = 99, true
		ref := sql.NullInt64{Int64: 99, Valid: true}
		gerr, werr := assign(&n, src), ref.Scan(src)
		if (werr == nil) != (gerr == nil) || (werr == nil && n.NullInt64 != ref) {
			t.Errorf("nullInt<-%#v: %+v, %v; sql.NullInt64: %+v, %v", src, n.NullInt64, gerr, ref, werr)
		}
	}
}
