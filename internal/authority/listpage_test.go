package authority

import (
	"errors"
	"testing"

	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/pagetoken"
)

func TestPageSize(t *testing.T) {
	for _, tt := range []struct {
		in   int32
		want int
		bad  bool
	}{
		{0, defaultPageSize, false},
		{1, 1, false},
		{maxPageSize, maxPageSize, false},
		{maxPageSize + 1, 0, true},
		{-1, 0, true},
	} {
		got, err := pageSize(tt.in)
		if got != tt.want || (err != nil) != tt.bad {
			t.Errorf("pageSize(%d) = %d, %v; want %d, refused %v", tt.in, got, err, tt.want, tt.bad)
		}
		var ia invalidArgument
		if tt.bad && !errors.As(err, &ia) {
			t.Errorf("pageSize(%d) refused with %T, want invalidArgument", tt.in, err)
		}
	}
}

func TestPageCursor(t *testing.T) {
	valid := func(id string) bool { return jointoken.ValidID(id) }
	for _, tt := range []struct {
		name  string
		token string
		want  pagetoken.Cursor
		bad   bool
	}{
		{"none starts at the beginning", "", pagetoken.Cursor{}, false},
		{"issued", pagetoken.Encode(pagetoken.Tokens, pagetoken.Cursor{Micros: 42, ID: "7f3k2a"}), pagetoken.Cursor{Micros: 42, ID: "7f3k2a"}, false},
		{"another list's", pagetoken.Encode(pagetoken.Agents, pagetoken.Cursor{ID: "7f3k2a"}), pagetoken.Cursor{}, true},
		{"an ID the list never holds", pagetoken.Encode(pagetoken.Tokens, pagetoken.Cursor{ID: "../../x"}), pagetoken.Cursor{}, true},
		{"garbage", "%%%", pagetoken.Cursor{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := pageCursor(pagetoken.Tokens, tt.token, valid)
			if got != tt.want || (err != nil) != tt.bad {
				t.Errorf("pageCursor(%q) = %v, %v; want %v, refused %v", tt.token, got, err, tt.want, tt.bad)
			}
		})
	}
}
