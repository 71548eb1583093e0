package store

// Seed is a batch of fixture rows written at once by a bulk loader (muster
// bench seed): tokens, and joined nodes each with its current instance and
// that instance's certificate, as a join writes them. A bulk loader writes
// rows as given, with no conditions, claims or audit records: it is for
// building a store of a given size to measure an authority against, with
// the authority stopped, never for admitting anything.
type Seed struct {
	Tokens       []Token
	Instances    []Instance
	Nodes        []Node
	Certificates []Certificate
}

// TokenCounts are the tokens by state (see CountTokens).
type TokenCounts struct {
	Active, Expired, UsedUp int64
}
