package enroll

// Reasons of token join refusals: sentences for the person at the agent,
// each of which the service layer also gives a machine word
// (internal/authority/status.go), so tools need not match the sentence.
const (
	ReasonTokenExpired        = "join token expired"
	ReasonTokenUsedUp         = "join token has no uses left"
	ReasonTokenSpent          = "join token has no uses left or expired"
	ReasonTokenBoundElsewhere = "join token is bound to another node"
	ReasonNodeTakenToken      = "node ID already exists; delete the node or use a token bound to it with --node"
	ReasonNodeTaken           = "node ID already exists; an operator must delete the node before it can join again"
)
