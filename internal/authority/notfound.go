package authority

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
