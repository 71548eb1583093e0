package authority

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// notFound names what is missing in a store's not-found error ("no join
// token \"abc123\""), where toStatus alone could only say "not found".
// Other errors pass through.
func notFound(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return status.Error(codes.NotFound, "no "+what)
	}
	return err
}

// Where the names a badName refusal is about are listed.
const (
	nodesListed     = "the enrolled nodes: muster agents list"
	operatorsListed = "the operators: muster admin list"
)

// badName refuses name, given as field, when it is no node ID or operator
// name (kind): spiffeid.NameError (what in it breaks the rule, the rule)
// and where the names there are are listed. nil for a valid name.
func badName(field, kind, name, listed string) error {
	err := spiffeid.NameError(field, kind, name)
	if err == nil {
		return nil
	}
	return badRequest(fmt.Sprintf("%v (%s)", err, listed))
}
