package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// jwtRotateJSON is what ca rotate jwt -o json prints.
type jwtRotateJSON struct {
	Version       int64     `json:"version"`
	KeyID         string    `json:"key_id"`
	PreviousKeyID string    `json:"previous_key_id"`
	RotatedAt     time.Time `json:"rotated_at"`
}

// rotateJWTKey is ca rotate jwt: the JWT-SVID signing key's next version
// signs from now on.
func rotateJWTKey(cmd *cobra.Command, env *Env, af *adminFlags, out output) error {
	resp, err := callAdmin(cmd, env, af, "ca rotate jwt", func(ctx context.Context, c *adminClient) (*musterv1.RotateJWTKeyResponse, error) {
		return c.RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{})
	})
	if err != nil {
		return err
	}
	j := jwtRotateJSON{Version: resp.GetVersion(), KeyID: resp.GetKeyId(), PreviousKeyID: resp.GetPreviousKeyId(),
		RotatedAt: resp.GetRotatedAt().AsTime().UTC()}
	if out.json() {
		return out.write(env.Stdout, j)
	}
	fmt.Fprintf(env.Stdout, "JWT-SVID key rotated to version %d (kid %s) at %s; kid %s stays in the JWKS until its tokens have expired\n",
		j.Version, j.KeyID, j.RotatedAt.Format(time.RFC3339), j.PreviousKeyID)
	return nil
}
