package cli

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// pagesOf serves items in pages of the sizes given, then an empty last
// page, as the authority may.
func pagesOf(items []tokenJSON, sizes ...int) pager[tokenJSON] {
	return func(token string) ([]tokenJSON, string, error) {
		page := 0
		if token != "" {
			fmt.Sscanf(token, "p%d", &page)
		}
		from := 0
		for _, n := range sizes[:page] {
			from += n
		}
		if page == len(sizes) {
			return nil, "", nil
		}
		return items[from : from+sizes[page]], fmt.Sprintf("p%d", page+1), nil
	}
}

// TestListPrintedPageByPage: printed as pages arrive (some empty), -o json
// and -o yaml are byte for byte what out.write prints for the whole list,
// the table has one header, and an empty list prints as before.
func TestListPrintedPageByPage(t *testing.T) {
	items := []tokenJSON{{ID: "aaaaaa", State: "active"}, {ID: "bbbbbb", State: "expired", Description: "<b> & \"q\""},
		{ID: "cccccc", State: "used_up", Labels: map[string]string{"k": "v"}}, {ID: "dddddd"}, {ID: "eeeeee"}}
	for _, format := range []string{"json", "yaml", "text"} {
		for _, list := range [][]tokenJSON{items, {}} {
			t.Run(fmt.Sprintf("%s/%d", format, len(list)), func(t *testing.T) {
				out := output{format: format}
				var want, got bytes.Buffer
				if format == "text" {
					mustNil(t, tokenTable(&want, list, true))
				} else {
					mustNil(t, out.write(&want, list))
				}
				sizes := []int{0}
				if len(list) > 0 {
					sizes = []int{2, 0, 1, 2}
				}
				lo := &listOut[tokenJSON]{w: &got, out: out, table: tokenTable}
				mustNil(t, eachPage(0, pagesOf(list, sizes...), lo.page))
				mustNil(t, lo.end())
				if format == "text" {
					// Pages align their columns on their own: compare the
					// words and the one header.
					if g, w := fieldsOf(got.String()), fieldsOf(want.String()); !slices.Equal(g, w) {
						t.Errorf("table by pages:\n%s\nwant the rows of\n%s", got.String(), want.String())
					}
					return
				}
				if got.String() != want.String() {
					t.Errorf("by pages:\n%s\nwant\n%s", got.String(), want.String())
				}
			})
		}
	}
}

func fieldsOf(s string) []string { return strings.Fields(s) }

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestEachPageStopsAtTheLimit(t *testing.T) {
	items := []tokenJSON{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}, {ID: "e"}}
	for _, tt := range []struct {
		limit int
		want  int
	}{{0, 5}, {1, 1}, {2, 2}, {3, 3}, {5, 5}, {9, 5}} {
		got, fetched := 0, 0
		fetch := pagesOf(items, 2, 2, 1)
		err := eachPage(tt.limit, func(tok string) ([]tokenJSON, string, error) {
			fetched++
			return fetch(tok)
		}, func(page []tokenJSON) error {
			got += len(page)
			return nil
		})
		mustNil(t, err)
		if got != tt.want {
			t.Errorf("limit %d: %d items, want %d", tt.limit, got, tt.want)
		}
		if tt.limit == 1 && fetched != 1 {
			t.Errorf("limit 1 fetched %d pages, want 1", fetched)
		}
	}
	boom := errors.New("boom")
	err := eachPage(0, func(string) ([]tokenJSON, string, error) { return nil, "", boom }, func([]tokenJSON) error { return nil })
	if !errors.Is(err, boom) {
		t.Errorf("eachPage = %v, want the fetch's error", err)
	}
}
