// Command mkimage builds muster's container image without a container
// engine: one layer holding the static binary at /muster on an empty base
// (no shell, no libc, no package manager), run as a non-root user, written
// as a `docker save` tarball that `docker load`, `podman load` and
// `crane push` accept. The licence goes beside it, at
// /usr/share/doc/muster/LICENSE.
//
//	go run ./mkimage -binary dist/muster -license ../LICENSE -tag muster:dev -o dist/muster-image.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// nonRoot is the UID and GID the image runs as (distroless's "nonroot").
const nonRoot = "65532:65532"

func main() {
	binary := flag.String("binary", "dist/muster", "static muster binary to put at /muster")
	license := flag.String("license", "LICENSE", "licence to put at /"+licensePath)
	tag := flag.String("tag", "muster:dev", "image name and tag recorded in the tarball")
	out := flag.String("o", "dist/muster-image.tar", "output tarball")
	arch := flag.String("arch", "amd64", "GOARCH the binary was built for")
	version := flag.String("version", "dev", "version label")
	created := flag.String("created", "", "image creation time, RFC 3339 (default: the binary's modification time, for reproducible images)")
	flag.Parse()
	if err := build(*binary, *license, *tag, *out, *arch, *version, *created); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// licensePath is where the image holds muster's licence.
const licensePath = "usr/share/doc/muster/LICENSE"

func build(binary, license, tag, out, arch, version, created string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	lic, err := os.ReadFile(license)
	if err != nil {
		return err
	}
	st, err := os.Stat(binary)
	if err != nil {
		return err
	}
	when := st.ModTime().UTC().Truncate(time.Second)
	if created != "" {
		if when, err = time.Parse(time.RFC3339, created); err != nil {
			return fmt.Errorf("-created: %w", err)
		}
	}
	layerTar, err := layerOf(bin, lic, when)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: when}
	cf.Config = v1.Config{
		User:       nonRoot,
		Entrypoint: []string{"/muster"},
		Cmd:        []string{"--help"},
		WorkingDir: "/",
		Env:        []string{"MUSTER_LOG_FORMAT=json"},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "muster",
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.source":  "https://github.com/muster-dev/muster",
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

// layerOf is the image's one layer: /muster, its licence, and /tmp and
// /data owned by the non-root user (a writable place for --data when no
// volume is mounted). Fixed times and owners keep the layer reproducible.
func layerOf(bin, license []byte, when time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"tmp/", "data/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, Uid: 65532, Gid: 65532, ModTime: when}); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"usr/", "usr/share/", "usr/share/doc/", "usr/share/doc/muster/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: when}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: licensePath, Mode: 0o644, Size: int64(len(license)), ModTime: when}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(license); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "muster", Mode: 0o755, Size: int64(len(bin)), ModTime: when}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
