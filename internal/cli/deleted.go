package cli

// deleted is what every delete command prints with -o json or yaml: the
// ID it deleted (node_id for a node), so a script can tell what went.
type deleted struct {
	ID      string `json:"id,omitempty"`
	NodeID  string `json:"node_id,omitempty"`
	Deleted bool   `json:"deleted"`
}
