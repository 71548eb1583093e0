// Package shellword quotes the words of the commands muster prints for an
// operator to paste (a hint's way out, a banner's next step), so that a
// path with a space or a shell metacharacter in it pastes into a POSIX
// shell as the one word it is.
package shellword

import "strings"

// safe are the bytes a word may hold and still be pasted bare: none of
// them is special to a POSIX shell inside a word.
const safe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:=@,"

// Quote returns s as one shell word: s itself when every byte of it is
// safe, so the common path reads as typed; else s in single quotes,
// inside which a POSIX shell takes every byte literally, with each single
// quote of s closing the quotes, escaped, and opening them again:
//
//	/srv/my dir  ->  '/srv/my dir'
//	/srv/it's    ->  '/srv/it'\''s'
//
// The empty string is two single quotes: an empty word, not none. A word
// that starts with = is quoted too: zsh, the shell many operators paste
// into, reads a bare =NAME as the path of the command NAME.
func Quote(s string) string {
	if s != "" && s[0] != '=' && strings.Trim(s, safe) == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
