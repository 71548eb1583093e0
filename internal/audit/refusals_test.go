package audit

import (
	"context"
	"fmt"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

func TestRefusals(t *testing.T) {
	refusal := func(src string) Event {
		return Event{Actor: "anonymous", Action: "thing.do", Result: ResultDenied, Reason: "no", Source: src}
	}
	tests := []struct {
		name string
		// sources lists one source per refusal.
		sources []string
		// wantOne is how many refusals are recorded one by one; wantFlood
		// the aggregate records, by target, with their counts.
		wantOne   int
		wantFlood map[string]int
	}{
		{
			name:    "under the cap",
			sources: repeat("10.0.0.1", RefusalsPerSource),
			wantOne: RefusalsPerSource,
		},
		{
			name:      "one source floods",
			sources:   append(repeat("10.0.0.1", RefusalsPerSource+7), "10.0.0.2"),
			wantOne:   RefusalsPerSource + 1,
			wantFlood: map[string]int{"10.0.0.1": 7},
		},
		{
			name:      "many sources: the window cap holds",
			sources:   distinct(RefusalsPerWindow + 30),
			wantOne:   RefusalsPerWindow,
			wantFlood: floodOf(distinct(RefusalsPerWindow + 30)[RefusalsPerWindow:]),
		},
		{
			name:      "sources past the counted ones are pooled",
			sources:   distinct(RefusalsPerWindow + RefusalSources + 50),
			wantOne:   RefusalsPerWindow,
			wantFlood: floodOf(distinct(RefusalsPerWindow + RefusalSources + 50)[RefusalsPerWindow:]),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &memStore{}
			l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey, Now: newClock().Now})
			if err != nil {
				t.Fatal(err)
			}
			r := NewRefusals(l, "discovery", nil)
			ctx, cancel := context.WithCancel(context.Background())
			for _, src := range tt.sources {
				r.Record(ctx, refusal(src))
			}
			cancel()
			if err := r.Run(ctx); err != nil { // cancelled: flushes once
				t.Fatal(err)
			}
			recs, err := m.ListAudit(context.Background(), store.AuditFilter{})
			if err != nil {
				t.Fatal(err)
			}
			one, flood := 0, map[string]int{}
			for _, rec := range recs {
				if rec.Action != "api.access.flood" {
					one++
					continue
				}
				if rec.Actor != "discovery" || rec.Result != ResultDenied {
					t.Errorf("aggregate record %+v, want actor discovery, result denied", rec)
				}
				var n int
				if _, err := fmt.Sscanf(rec.Reason, "%d further", &n); err != nil {
					t.Errorf("aggregate reason %q: %v", rec.Reason, err)
				}
				flood[rec.Target] = n
			}
			if one != tt.wantOne {
				t.Errorf("%d refusals recorded one by one, want %d", one, tt.wantOne)
			}
			if len(flood) != len(tt.wantFlood) {
				t.Errorf("%d aggregate records, want %d", len(flood), len(tt.wantFlood))
			}
			for src, n := range tt.wantFlood {
				if flood[src] != n {
					t.Errorf("aggregate for %q counts %d, want %d", src, flood[src], n)
				}
			}
			// A new window starts empty.
			r.Record(context.Background(), refusal("10.0.0.1"))
			if recs2, _ := m.ListAudit(context.Background(), store.AuditFilter{}); len(recs2) != len(recs)+1 {
				t.Errorf("after the flush a refusal is not recorded: %d records, want %d", len(recs2), len(recs)+1)
			}
		})
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func distinct(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("2001:db8::%x", i)
	}
	return out
}

// floodOf is the aggregate Refusals writes for refusals from srcs that were
// all over the window cap, each source once.
func floodOf(srcs []string) map[string]int {
	out := map[string]int{}
	for i, s := range srcs {
		if i >= RefusalSources {
			s = OtherSources
		}
		out[s]++
	}
	return out
}
