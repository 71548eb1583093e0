package store

// Claim is one condition a join must win, checked and recorded inside the
// join's write (CommitJoin), so that it happens once even with replicas:
// a token use, a referral ticket's use, and the claims of later join
// methods. A join method states what it claims; every backend applies each
// kind the same way, whatever method asked for it, so a new method adds a
// kind here and its case in each backend (SQLite's applyClaim,
// PostgreSQL's claimStatement, with the re-read that explains a lost
// write), never a branch in the join itself. A failed claim fails the join with its sentinel and
// nothing is written.
//
// The set is closed (the method is unexported): a backend that meets a
// kind it does not know fails the join rather than skipping the condition.
type Claim interface{ claim() }

// TokenUse takes one use of a token: ErrTokenSpent if it is expired or used
// up by the store clock, ErrNotFound if it is gone.
type TokenUse struct{ TokenID string }

func (TokenUse) claim()  {}
func (TicketUse) claim() {}

// AllClaims returns every claim of the join, in the order the backends apply
// them: the use of TokenID, the use of Ticket, then j.Claims.
func (j Join) AllClaims() []Claim {
	var cs []Claim
	if j.TokenID != "" {
		cs = append(cs, TokenUse{TokenID: j.TokenID})
	}
	if j.Ticket != nil {
		cs = append(cs, *j.Ticket)
	}
	return append(cs, j.Claims...)
}
