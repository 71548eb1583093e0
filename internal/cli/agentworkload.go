package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/workload"
)

// workloadFlags are agent run's --workload-api flags; each overrides its
// key of agent.yaml's workload_api section.
type workloadFlags struct {
	listen, mode         string
	socketUID, socketGID int
	allowUIDs, allowGIDs []uint
	maxStreams           int
	callTimeout          string
}

func (w *workloadFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&w.listen, "workload-api", "", "serve the SPIFFE Workload API on this socket, unix:///PATH (empty: off; agent.yaml workload_api.listen)")
	f.StringVar(&w.mode, "workload-api-socket-mode", "", "permission bits of the Workload API socket, octal (default 0600; workload_api.socket_mode)")
	f.IntVar(&w.socketUID, "workload-api-socket-uid", -1, "owner UID of the Workload API socket (default: the agent's; workload_api.socket_uid)")
	f.IntVar(&w.socketGID, "workload-api-socket-gid", -1, "group of the Workload API socket (default: the agent's; workload_api.socket_gid)")
	f.UintSliceVar(&w.allowUIDs, "workload-api-allow-uids", nil, "UIDs admitted to the Workload API, comma-separated (default: the agent's own; workload_api.allow_uids)")
	f.UintSliceVar(&w.allowGIDs, "workload-api-allow-gids", nil, "primary GIDs admitted to the Workload API, comma-separated (workload_api.allow_gids)")
	f.IntVar(&w.maxStreams, "workload-api-max-streams-per-uid", 0, "open Workload API streams one UID may hold (default 32; workload_api.max_streams_per_uid)")
	f.StringVar(&w.callTimeout, "workload-api-call-timeout", "", "the longest a unary Workload API call (FetchJWTSVID, ValidateJWTSVID) may last, its request and reply included (default 1m, at least 1s; workload_api.call_timeout)")
}

// workloadAPI is a Workload API ready to serve: its socket is listening.
type workloadAPI struct {
	lis  net.Listener
	path string
	// passed is set when lis is the socket systemd passed (socket
	// activation), which the agent neither makes nor removes.
	passed bool
	src    *workload.Source
	cfg    workload.Config
}

// setup resolves the settings (flags over agent.yaml) and creates the
// socket, or takes the one systemd passed (muster-agent.socket), so a
// wrong setting stops agent run before it starts; nil when no Workload
// API is asked for and no socket was passed.
func (w *workloadFlags) setup(cmd *cobra.Command, getenv func(string) string, dir agent.Dir, log *slog.Logger, m *agent.Metrics) (_ *workloadAPI, err error) {
	cfg, err := dir.ReadConfig()
	if err != nil {
		return nil, err
	}
	c := agent.WorkloadAPIConfig{}
	if cfg.WorkloadAPI != nil {
		c = *cfg.WorkloadAPI
	}
	f := cmd.Flags()
	if f.Changed("workload-api") {
		c.Listen = w.listen
	}
	var path string
	if c.Listen != "" {
		if path, err = workload.ParseAddr(c.Listen); err != nil {
			return nil, err
		}
	}
	// A socket passed by systemd is checked against the path asked for
	// (with none asked for, the unit's is taken), and the variables
	// that pass it are for this process alone, whatever becomes of it.
	passed, err := workload.Inherited(getenv, path)
	workload.UnsetListenEnv()
	if err != nil {
		return nil, err
	}
	if passed != nil {
		defer func() {
			if err != nil {
				passed.Close()
			}
		}()
		if path == "" {
			path = passed.Addr().String()
			log.Info("workload api: serving on the socket systemd passed (muster-agent.socket), though no --workload-api or workload_api.listen is set; systemctl mask --now muster-agent.socket turns it off", "path", path)
		}
	}
	if path == "" {
		return nil, nil
	}
	if !workload.PeerCredsSupported {
		return nil, errors.New("the Workload API admits callers by their credentials (SO_PEERCRED), read on Linux only")
	}
	sock := workload.Socket{Path: path, Mode: 0o600, UID: -1, GID: -1}
	if f.Changed("workload-api-socket-mode") {
		c.SocketMode = w.mode
	}
	if c.SocketMode != "" {
		if sock.Mode, err = workload.ParseMode(c.SocketMode); err != nil {
			return nil, err
		}
	}
	if c.SocketUID != nil {
		sock.UID = *c.SocketUID
	}
	if c.SocketGID != nil {
		sock.GID = *c.SocketGID
	}
	if f.Changed("workload-api-socket-uid") {
		sock.UID = w.socketUID
	}
	if f.Changed("workload-api-socket-gid") {
		sock.GID = w.socketGID
	}
	sc := workload.Config{AllowUIDs: c.AllowUIDs, AllowGIDs: c.AllowGIDs, MaxStreamsPerUID: c.MaxStreamsPerUID,
		Log: log, Registerer: m.Registerer()}
	if f.Changed("workload-api-allow-uids") {
		sc.AllowUIDs = uint32s(w.allowUIDs)
	}
	if f.Changed("workload-api-allow-gids") {
		sc.AllowGIDs = uint32s(w.allowGIDs)
	}
	if len(sc.AllowUIDs) == 0 && len(sc.AllowGIDs) == 0 {
		sc.AllowUIDs = []uint32{uint32(os.Geteuid())}
	}
	if f.Changed("workload-api-max-streams-per-uid") {
		sc.MaxStreamsPerUID = w.maxStreams
	}
	if sc.MaxStreamsPerUID < 0 {
		return nil, fmt.Errorf("max streams per UID %d: want a positive number", sc.MaxStreamsPerUID)
	}
	if f.Changed("workload-api-call-timeout") {
		c.CallTimeout = w.callTimeout
	}
	if c.CallTimeout != "" {
		if sc.CallTimeout, err = time.ParseDuration(c.CallTimeout); err != nil || sc.CallTimeout < time.Second {
			return nil, fmt.Errorf("workload_api.call_timeout %q: want a duration of at least 1s, such as 1m", c.CallTimeout)
		}
	}
	lis := passed
	if passed != nil {
		// systemd made the socket with the unit's mode and owner, which
		// the agent leaves as they are: it may not be allowed to change
		// them (ProtectSystem=), and the unit is where they are set.
		if d := workload.Differs(sock, c.SocketMode != ""); d != "" {
			log.Warn("workload api: the socket systemd passed is not as the agent's settings ask; set them in the socket unit (systemctl edit muster-agent.socket)", "path", path, "differs", d)
		}
	} else if lis, err = workload.Listen(sock); err != nil {
		return nil, err
	}
	src := workload.NewSource(dir.LoadIdentity, log)
	src.Reload()
	sc.Socket = &sock
	return &workloadAPI{lis: lis, path: path, passed: passed != nil, src: src, cfg: sc}, nil
}

func uint32s(v []uint) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = uint32(x)
	}
	return out
}

// onIdentity is the agent's OnIdentity: a nil API has nothing to reload.
func (w *workloadAPI) onIdentity() func() {
	if w == nil {
		return nil
	}
	return w.src.Reload
}

// start serves the API and watches the identity files in g until ctx ends;
// JWT-SVIDs come from a.
func (w *workloadAPI) start(ctx context.Context, g *errgroup.Group, dir agent.Dir, a *agent.Agent) {
	if w == nil {
		return
	}
	w.cfg.JWT = a
	srv := workload.NewServer(w.src, w.cfg)
	g.Go(func() error {
		w.src.Watch(ctx, filepath.Dir(dir.CertFile()))
		return nil
	})
	g.Go(func() error {
		if err := srv.Serve(ctx, w.lis); err != nil {
			return fmt.Errorf("workload api: %w", err)
		}
		return nil
	})
}
