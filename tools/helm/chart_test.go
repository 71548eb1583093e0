package helm

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The chart rendered with helm's own engine, as helm template renders it,
// and read into Kubernetes' types: what a cluster would run.

const chartDir = "../../deploy/helm/muster"

// render renders the chart with the --set style assignments and returns
// its manifests by kind/name.
func render(t *testing.T, sets ...string) map[string][]byte {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	for _, s := range append([]string{"image.tag=v9.9.9"}, sets...) {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "t", Namespace: "default", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatalf("rendering with %v: %v", sets, err)
	}
	out := map[string][]byte{}
	for name, text := range files {
		for _, doc := range strings.Split(text, "\n---") {
			var meta struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if meta.Kind != "" {
				out[meta.Kind+"/"+meta.Metadata.Name] = []byte(doc)
			}
		}
	}
	return out
}

func daemonSet(t *testing.T, docs map[string][]byte) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	doc, ok := docs["DaemonSet/t-muster-agent"]
	if !ok {
		t.Fatalf("no agent DaemonSet among %v", keys(docs))
	}
	if err := yaml.UnmarshalStrict(doc, &ds); err != nil {
		t.Fatal(err)
	}
	return &ds
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

func env(c *corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// mountOf returns the volume mounted at dir in c, or nil.
func mountOf(spec *corev1.PodSpec, c *corev1.Container, dir string) *corev1.Volume {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) != path.Clean(dir) {
			continue
		}
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == m.Name {
				return &spec.Volumes[i]
			}
		}
	}
	return nil
}

// The agent DaemonSet serves the Workload API on a socket in a hostPath
// directory of the node, which workload pods mount: the socket directory
// is the node's, owned by the agent's user (the init container), and the
// socket's mode and admission are the values'.
func TestAgentWorkloadAPISocket(t *testing.T) {
	cases := []struct {
		name    string
		sets    []string
		hostDir string
		want    map[string]string // the Workload API variables, exactly
		groups  []int64
	}{
		{
			name:    "default",
			sets:    []string{"agent.enabled=true"},
			hostDir: "/run/muster/agent-sockets",
			want: map[string]string{
				"MUSTER_WORKLOAD_API":             "unix:///run/muster/agent.sock",
				"MUSTER_WORKLOAD_API_SOCKET_MODE": "0600",
			},
		},
		{
			name: "a group of workloads",
			sets: []string{"agent.enabled=true", "agent.workloadAPI.socketMode=0660", "agent.workloadAPI.socketGID=1001",
				"agent.workloadAPI.allowGIDs={1001}", "agent.workloadAPI.allowUIDs={0,1002}", "agent.workloadAPI.hostSocketDir=/run/spiffe"},
			hostDir: "/run/spiffe",
			want: map[string]string{
				"MUSTER_WORKLOAD_API":             "unix:///run/muster/agent.sock",
				"MUSTER_WORKLOAD_API_SOCKET_MODE": "0660",
				"MUSTER_WORKLOAD_API_SOCKET_GID":  "1001",
				"MUSTER_WORKLOAD_API_ALLOW_GIDS":  "1001",
				"MUSTER_WORKLOAD_API_ALLOW_UIDS":  "0,1002",
			},
			groups: []int64{1001},
		},
		{
			name: "off",
			sets: []string{"agent.enabled=true", "agent.workloadAPI.enabled=false"},
			want: map[string]string{},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ds := daemonSet(t, render(t, tc.sets...))
			spec := &ds.Spec.Template.Spec
			agent := container(t, spec.Containers, "agent")
			got := map[string]string{}
			for k, v := range env(agent) {
				if strings.HasPrefix(k, "MUSTER_WORKLOAD_API") {
					got[k] = v
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("Workload API variables %v, want %v", got, tc.want)
			}
			if fmt.Sprint(spec.SecurityContext.SupplementalGroups) != fmt.Sprint(tc.groups) {
				t.Errorf("supplementalGroups %v, want %v", spec.SecurityContext.SupplementalGroups, tc.groups)
			}
			if tc.hostDir == "" {
				for _, v := range spec.Volumes {
					if v.HostPath != nil && v.Name != "data" {
						t.Errorf("Workload API off, and a hostPath %s is mounted", v.HostPath.Path)
					}
				}
				return
			}
			sockDir := path.Dir(strings.TrimPrefix(tc.want["MUSTER_WORKLOAD_API"], "unix://"))
			v := mountOf(spec, agent, sockDir)
			if v == nil || v.HostPath == nil || v.HostPath.Path != tc.hostDir {
				t.Fatalf("the socket's directory %s is %+v in the agent, want the node's %s", sockDir, v, tc.hostDir)
			}
			if v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("the socket directory's hostPath type is %v, want DirectoryOrCreate", v.HostPath.Type)
			}
			// kubelet makes it root's: the init container gives it to the
			// agent's user, so the agent (no capabilities) can make the
			// socket in it, and leaves it traversable by every workload.
			own := container(t, spec.InitContainers, "own-data")
			if iv := mountOf(spec, own, sockDir); iv == nil || iv.Name != v.Name {
				t.Fatalf("the init container does not mount the socket directory at %s", sockDir)
			}
			cmd := strings.Join(own.Command, " ")
			uid := *spec.SecurityContext.RunAsUser
			if !strings.Contains(cmd, fmt.Sprintf("chown %d:%d /var/lib/muster-agent %s", uid, uid, sockDir)) ||
				!strings.Contains(cmd, "chmod 0755 "+sockDir) {
				t.Errorf("init container %q does not give %s to %d with mode 0755", cmd, sockDir, uid)
			}
		})
	}
}

// An unquoted socketMode in a values file is a YAML number (0660 is 432):
// the chart refuses it rather than give the agent a mode it reads wrong.
func TestAgentWorkloadAPISocketModeMustBeAString(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValues([]byte("image: {tag: v1}\nagent: {enabled: true, workloadAPI: {socketMode: 0660}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "t", Namespace: "default"}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Render(ch, rv); err == nil || !strings.Contains(err.Error(), `quoted octal string such as "0660"`) {
		t.Fatalf("rendering socketMode: 0660 unquoted: %v", err)
	}
}

// The authority's root filesystem is read-only; SQLite keeps the
// temporary files of sorts and index builds larger than its cache in /tmp
// (SQLITE_TMPDIR, TMPDIR, /var/tmp, /usr/tmp, /tmp, then the working
// directory, /), and with none writable they fail ("disk I/O error", an
// upgrade's migration among them). Every muster container with a
// read-only root that opens a SQLite store has an emptyDir at /tmp.
func TestAuthorityHasAWritableTmp(t *testing.T) {
	for _, sets := range [][]string{nil, {"authority.postgres.urlSecret=pg"}} {
		docs := render(t, sets...)
		var spec corev1.PodSpec
		switch {
		case docs["StatefulSet/t-muster"] != nil:
			var s appsv1.StatefulSet
			if err := yaml.UnmarshalStrict(docs["StatefulSet/t-muster"], &s); err != nil {
				t.Fatal(err)
			}
			spec = s.Spec.Template.Spec
		case docs["Deployment/t-muster"] != nil:
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict(docs["Deployment/t-muster"], &d); err != nil {
				t.Fatal(err)
			}
			spec = d.Spec.Template.Spec
		default:
			t.Fatalf("%v: no authority among %v", sets, keys(docs))
		}
		c := container(t, spec.Containers, "authority")
		if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
			t.Fatalf("%v: the authority's root filesystem is not read-only", sets)
		}
		v := mountOf(&spec, c, "/tmp")
		if v == nil || v.EmptyDir == nil {
			t.Errorf("%v: the authority has a read-only root and no emptyDir at /tmp (%+v)", sets, v)
			continue
		}
		if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != "1Gi" {
			t.Errorf("%v: /tmp's size limit is %v, want authority.tmpSizeLimit's 1Gi", sets, v.EmptyDir.SizeLimit)
		}
	}
}

// The agent container runs as the chart renders it: muster with its args
// and environment, its volumes' mount paths moved under a temporary
// directory (the same file layout). It serves the Workload API on the socket in the
// node's directory with the mode the values give, before it has joined.
func TestAgentContainerServesTheSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("builds muster")
	}
	bin := filepath.Join(t.TempDir(), "muster")
	build := exec.Command("go", "build", "-o", bin, "./cmd/muster")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, mode := range []string{"0600", "0660"} {
		t.Run(mode, func(t *testing.T) {
			ds := daemonSet(t, render(t, "agent.enabled=true", "agent.workloadAPI.socketMode="+mode))
			spec := &ds.Spec.Template.Spec
			c := container(t, spec.Containers, "agent")
			root := t.TempDir()
			node := map[string]string{} // a volume's directory on the "node"
			moved := func(s string) string {
				for _, m := range c.VolumeMounts {
					if s == m.MountPath || strings.HasPrefix(s, m.MountPath+"/") {
						return filepath.Join(node[m.Name], strings.TrimPrefix(s, m.MountPath))
					}
				}
				return s
			}
			for _, m := range c.VolumeMounts {
				node[m.Name] = filepath.Join(root, m.Name)
				// As the init container leaves them.
				perm := os.FileMode(0o755)
				if m.Name == "data" {
					perm = 0o700
				}
				if err := os.Mkdir(node[m.Name], perm); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(bin, c.Args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
			for _, e := range c.Env {
				v := e.Value
				switch {
				case e.ValueFrom != nil && e.Name == "MUSTER_NODE_ID":
					v = "node-1"
				case e.ValueFrom != nil && e.Name == "MUSTER_JOIN_URI":
					// No authority answers: the agent keeps trying to join.
					v = "muster+token://abcdef.0123456789abcdef@127.0.0.1:1?fingerprint=sha256:" + strings.Repeat("ab", 32)
				case e.ValueFrom != nil:
					t.Fatalf("%s comes from %v: give the test a value for it", e.Name, e.ValueFrom)
				case e.Name == "MUSTER_METRICS_LISTEN":
					v = "127.0.0.1:0"
				case strings.HasPrefix(v, "unix://"):
					v = "unix://" + moved(strings.TrimPrefix(v, "unix://"))
				default:
					v = moved(v)
				}
				cmd.Env = append(cmd.Env, e.Name+"="+v)
			}
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				cmd.Process.Kill()
				cmd.Wait()
			}()
			lines := make(chan string, 100)
			go func() {
				s := bufio.NewScanner(stderr)
				for s.Scan() {
					select {
					case lines <- s.Text():
					default:
					}
				}
				close(lines)
			}()
			addr, ok := env(c)["MUSTER_WORKLOAD_API"]
			if !ok {
				t.Fatal("the agent container has no MUSTER_WORKLOAD_API")
			}
			sock := moved(strings.TrimPrefix(addr, "unix://"))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var log []string
			for {
				if conn, err := (&net.Dialer{}).DialContext(ctx, "unix", sock); err == nil {
					conn.Close()
					break
				}
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("the agent stopped before serving %s:\n%s", sock, strings.Join(log, "\n"))
					}
					log = append(log, l)
				case <-time.After(50 * time.Millisecond):
				case <-ctx.Done():
					t.Fatalf("no Workload API socket at %s:\n%s", sock, strings.Join(log, "\n"))
				}
			}
			fi, err := os.Lstat(sock)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := strconv.ParseUint(mode, 8, 32)
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != os.FileMode(want) {
				t.Errorf("%s is %v, want a socket of mode %s", sock, fi.Mode(), mode)
			}
		})
	}
}

// docs/workload-api.md's Kubernetes example works with the chart: its pod
// spec is a valid Pod that mounts the node's socket directory where the
// agent's container has it, points SPIFFE_ENDPOINT_SOCKET at the agent's
// socket, and runs with a primary group the documented helm upgrade
// admits, on a socket whose group and mode let it connect.
func TestWorkloadAPIDocsPodSpec(t *testing.T) {
	doc, err := os.ReadFile("../../docs/workload-api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "### On Kubernetes")
	if !ok {
		t.Fatal(`docs/workload-api.md has no "### On Kubernetes" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n### ")
	block := func(lang string) string {
		_, b, ok := strings.Cut(sec, "```"+lang+"\n")
		if !ok {
			t.Fatalf("no %s block in the section", lang)
		}
		b, _, _ = strings.Cut(b, "```")
		return b
	}
	upgrade := strings.ReplaceAll(block("sh"), "\\\n", " ")
	if !strings.HasPrefix(upgrade, "helm upgrade m deploy/helm/muster --reuse-values ") {
		t.Fatalf("the section's command is %q", upgrade)
	}
	sets := []string{"agent.enabled=true"}
	words := strings.Fields(upgrade)
	for i, w := range words {
		if w == "--set" && i+1 < len(words) {
			sets = append(sets, strings.Trim(words[i+1], "'"))
		}
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(block("yaml")), &pod); err != nil {
		t.Fatalf("the pod spec: %v", err)
	}

	ds := daemonSet(t, render(t, sets...))
	spec := &ds.Spec.Template.Spec
	agent := container(t, spec.Containers, "agent")
	agentEnv := env(agent)
	sock := strings.TrimPrefix(agentEnv["MUSTER_WORKLOAD_API"], "unix://")
	nodeDir := mountOf(spec, agent, path.Dir(sock)).HostPath.Path

	app := &pod.Spec.Containers[0]
	if got := env(app)["SPIFFE_ENDPOINT_SOCKET"]; got != agentEnv["MUSTER_WORKLOAD_API"] {
		t.Errorf("the pod's SPIFFE_ENDPOINT_SOCKET %q, the agent serves %q", got, agentEnv["MUSTER_WORKLOAD_API"])
	}
	v := mountOf(&pod.Spec, app, path.Dir(sock))
	if v == nil || v.HostPath == nil || v.HostPath.Path != nodeDir {
		t.Fatalf("the pod mounts %+v at %s, the agent's socket directory is the node's %s", v, path.Dir(sock), nodeDir)
	}
	gid := fmt.Sprint(*pod.Spec.SecurityContext.RunAsGroup)
	uid := fmt.Sprint(*pod.Spec.SecurityContext.RunAsUser)
	if !strings.Contains(","+agentEnv["MUSTER_WORKLOAD_API_ALLOW_GIDS"]+",", ","+gid+",") &&
		!strings.Contains(","+agentEnv["MUSTER_WORKLOAD_API_ALLOW_UIDS"]+",", ","+uid+",") {
		t.Errorf("the pod runs as %s:%s, the agent admits UIDs %q and GIDs %q", uid, gid,
			agentEnv["MUSTER_WORKLOAD_API_ALLOW_UIDS"], agentEnv["MUSTER_WORKLOAD_API_ALLOW_GIDS"])
	}
	mode, err := strconv.ParseUint(agentEnv["MUSTER_WORKLOAD_API_SOCKET_MODE"], 8, 32)
	if err != nil || agentEnv["MUSTER_WORKLOAD_API_SOCKET_GID"] != gid || mode&0o020 == 0 {
		t.Errorf("the socket's group %q and mode %q do not let GID %s connect", agentEnv["MUSTER_WORKLOAD_API_SOCKET_GID"],
			agentEnv["MUSTER_WORKLOAD_API_SOCKET_MODE"], gid)
	}
}

// The Kubernetes manifests in docs/ are valid objects (read strictly into
// Kubernetes' types), and their HTTP probes ask for what muster's metrics
// listeners serve: /healthz or /readyz (/metrics answers too, but says
// nothing about health).
func TestDocsManifests(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs: %v", err)
	}
	pods := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		blocks := strings.Split(string(data), "```yaml\n")
		for _, b := range blocks[1:] {
			b, _, _ = strings.Cut(b, "```")
			for _, doc := range strings.Split(b, "\n---\n") {
				var meta struct {
					APIVersion string `json:"apiVersion"`
					Kind       string `json:"kind"`
				}
				if yaml.Unmarshal([]byte(doc), &meta) != nil || meta.APIVersion == "" {
					continue // not a Kubernetes object
				}
				var spec *corev1.PodSpec
				var err error
				switch meta.Kind {
				case "Pod":
					var o corev1.Pod
					err, spec = yaml.UnmarshalStrict([]byte(doc), &o), &o.Spec
				case "Deployment":
					var o appsv1.Deployment
					err, spec = yaml.UnmarshalStrict([]byte(doc), &o), &o.Spec.Template.Spec
				case "StatefulSet":
					var o appsv1.StatefulSet
					err, spec = yaml.UnmarshalStrict([]byte(doc), &o), &o.Spec.Template.Spec
				case "DaemonSet":
					var o appsv1.DaemonSet
					err, spec = yaml.UnmarshalStrict([]byte(doc), &o), &o.Spec.Template.Spec
				case "Secret":
					var o corev1.Secret
					err = yaml.UnmarshalStrict([]byte(doc), &o)
				default:
					continue
				}
				if err != nil {
					t.Errorf("%s: a %s: %v", f, meta.Kind, err)
					continue
				}
				if spec == nil {
					continue
				}
				pods++
				for _, c := range spec.Containers {
					for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
						if p == nil || p.HTTPGet == nil {
							continue
						}
						if p.HTTPGet.Path != "/healthz" && p.HTTPGet.Path != "/readyz" {
							t.Errorf("%s: container %s probes %s, which says nothing about health: /healthz or /readyz", f, c.Name, p.HTTPGet.Path)
						}
					}
				}
			}
		}
	}
	if pods == 0 {
		t.Error("no pod specs found in docs/*.md")
	}
}
