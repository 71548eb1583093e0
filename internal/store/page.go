package store

import "time"

// TokenKey is a token's place in the list order: CreatedAt, then ID. The
// zero key comes before every token.
type TokenKey struct {
	CreatedAt time.Time
	ID        string
}

// KeyOf returns the key of t, from which the next page starts.
func (t Token) KeyOf() TokenKey { return TokenKey{CreatedAt: t.CreatedAt, ID: t.ID} }
