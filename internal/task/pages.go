package task

import "encoding/json"

// pageSlack is what a signed task adds to its envelope beyond the node
// IDs' array: the wrapper object, the signature and the "node_ids" key.
const pageSlack = 256

// Pages splits nodes into the node-ID targets of as many tasks as it takes
// for each to stay within what an agent accepts: at most MaxNodeIDs IDs and
// MaxTaskBytes signed. The selection (a label selector, every node of a
// list) is resolved by the authority, and each page is a task of its own
// whose signed target is the list of nodes it names — what the agent
// verifies against its own node ID. e is the envelope the pages share (its
// params and type count against the size). Nodes are kept in order; nil for
// none.
func (e Envelope) Pages(nodes []string) [][]string {
	e.Target = Target{}
	base, err := json.Marshal(e)
	if err != nil {
		base = nil
	}
	budget := MaxTaskBytes - len(base) - pageSlack
	var pages [][]string
	start, size := 0, 0
	for i, id := range nodes {
		// Each ID costs its quotes and a comma; node IDs need no escaping.
		cost := len(id) + 3
		if i > start && (i-start == MaxNodeIDs || size+cost > budget) {
			pages = append(pages, nodes[start:i])
			start, size = i, 0
		}
		size += cost
	}
	if start < len(nodes) {
		pages = append(pages, nodes[start:])
	}
	return pages
}
