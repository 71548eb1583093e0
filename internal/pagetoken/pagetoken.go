// Package pagetoken encodes the opaque page tokens of the admin API's list
// calls: a keyset cursor (the last item's place in the list order), never
// an offset, so an item inserted or deleted between two pages neither
// shifts nor repeats the others. A page token comes back from the client,
// so Decode treats it as untrusted input. It holds no secret and is not
// signed: any well-formed cursor names a place in the list, and a caller
// who may list may start anywhere.
package pagetoken

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"unicode/utf8"
)

// List names the list a cursor belongs to, so a cursor of one list is
// refused by another.
type List byte

// The lists that page.
const (
	Tokens List = 1
	Agents List = 2
)

// version is the first byte of every encoded cursor.
const version = 1

// MaxID bounds the ID a cursor carries: node IDs and token names are
// shorter.
const MaxID = 255

// maxEncoded bounds the text Decode reads before decoding it.
var maxEncoded = base64.RawURLEncoding.EncodedLen(2 + 8 + MaxID)

// Cursor is the place of the last item of a page: its ID and, for a list
// ordered by time first, its time in microseconds since the Unix epoch.
type Cursor struct {
	Micros int64
	ID     string
}

// ErrInvalid is returned for a page token that is not one this version
// issued for the list.
var ErrInvalid = errors.New("page token is not valid for this list (pass the next_page_token of the previous answer unchanged, or none to start)")

// Encode returns the page token of c for list.
func Encode(list List, c Cursor) string {
	b := make([]byte, 0, 2+8+len(c.ID))
	b = append(b, version, byte(list))
	b = binary.BigEndian.AppendUint64(b, uint64(c.Micros))
	b = append(b, c.ID...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Decode parses a page token of list; ErrInvalid if it is malformed, of
// another version or of another list, or carries an empty, overlong or
// non-UTF-8 ID, or is not spelt as Encode spells it. The empty token is not a cursor: callers start at the
// beginning without calling Decode.
func Decode(list List, s string) (Cursor, error) {
	if len(s) > maxEncoded {
		return Cursor{}, ErrInvalid
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) < 2+8+1 || b[0] != version || List(b[1]) != list {
		return Cursor{}, ErrInvalid
	}
	id := string(b[10:])
	if len(id) > MaxID || !utf8.ValidString(id) {
		return Cursor{}, ErrInvalid
	}
	c := Cursor{Micros: int64(binary.BigEndian.Uint64(b[2:10])), ID: id}
	// The decoder skips line breaks even when strict: accept only the one
	// spelling Encode gives, so a cursor has exactly one token.
	if Encode(list, c) != s {
		return Cursor{}, ErrInvalid
	}
	return c, nil
}
