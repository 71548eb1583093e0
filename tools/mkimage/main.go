// Command mkimage builds muster's container image without a container
// engine: one layer holding the static binary at /muster on an empty base
// (no shell, no libc, no package manager), run as a non-root user, written
// as a `docker save` tarball that `docker load`, `podman load` and
// `crane push` accept. The licence goes beside it, at
// /usr/share/doc/muster/LICENSE.
//
//	go run ./mkimage -binary dist/muster -license ../LICENSE -tag muster:dev -o dist/muster-image.tar
//
// The pkcs11 variant (docs/hsm.md) puts the cgo build at /muster-pkcs11
// (-name) and adds the tree scripts/pkcs11-runtime wrote (-root): glibc's
// loader and libraries, at their paths.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
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
	binName := flag.String("name", "muster", "the binary's name at the image's root, and its entrypoint")
	root := flag.String("root", "", "directory whose files, links and directories the layer also holds, at the same paths (scripts/pkcs11-runtime writes one)")
	flag.Parse()
	if err := build(*binary, *binName, *root, *license, *tag, *out, *arch, *version, *created); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// licensePath is where the image holds muster's licence.
const licensePath = "usr/share/doc/muster/LICENSE"

func build(binary, binName, root, license, tag, out, arch, version, created string) error {
	if binName == "" || strings.Contains(binName, "/") {
		return fmt.Errorf("-name %q: want a file name at the image's root", binName)
	}
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
	layerTar, err := layerOf(bin, binName, root, lic, when)
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
		Entrypoint: []string{"/" + binName},
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

// layerOf is the image's one layer: the binary at /NAME, its licence, and
// /tmp and /data owned by the non-root user (a writable place for --data
// when no volume is mounted), with root's tree if one is given. Entries in
// name order, fixed times and owners keep the layer reproducible.
func layerOf(bin []byte, binName, root string, license []byte, when time.Time) ([]byte, error) {
	entries := map[string]entry{
		"tmp/":                  {hdr: tar.Header{Typeflag: tar.TypeDir, Mode: 0o1777, Uid: 65532, Gid: 65532}},
		"data/":                 {hdr: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755, Uid: 65532, Gid: 65532}},
		licensePath:             {hdr: tar.Header{Typeflag: tar.TypeReg, Mode: 0o644}, data: license},
		binName:                 {hdr: tar.Header{Typeflag: tar.TypeReg, Mode: 0o755}, data: bin},
		"usr/":                  dirEntry,
		"usr/share/":            dirEntry,
		"usr/share/doc/":        dirEntry,
		"usr/share/doc/muster/": dirEntry,
	}
	if root != "" {
		if err := addTree(entries, root); err != nil {
			return nil, err
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	// A directory's name ends in "/" and so sorts before what it holds.
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := e.hdr
		h.Name, h.ModTime, h.Size = n, when, int64(len(e.data))
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// entry is one file, link or directory of the layer.
type entry struct {
	hdr  tar.Header
	data []byte
}

var dirEntry = entry{hdr: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}}

// addTree adds root's directories, regular files (read-only: 0755 when
// executable by its owner, else 0644) and symbolic links, owned by root,
// at their paths below root. Anything else, or a path the layer already
// holds as a file, is an error.
func addTree(entries map[string]entry, root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		var e entry
		switch {
		case d.IsDir():
			entries[name+"/"] = dirEntry
			return nil
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			e = entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			mode := int64(0o644)
			if info.Mode().Perm()&0o100 != 0 {
				mode = 0o755
			}
			e = entry{hdr: tar.Header{Typeflag: tar.TypeReg, Mode: mode}, data: data}
		default:
			return fmt.Errorf("-root: %s is neither a file, a link nor a directory", p)
		}
		if _, dup := entries[name]; dup {
			return fmt.Errorf("-root: %s is already in the image", name)
		}
		entries[name] = e
		return nil
	})
}
