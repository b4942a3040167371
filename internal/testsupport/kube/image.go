package kube

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// Container images without a registry: an image of one layer, written as
// an OCI image layout in a tar archive (the OCI Image Format
// Specification v1.1: oci-layout, index.json, blobs/sha256/…), which
// `ctr images import` loads into containerd.

// ImageFile is one entry of an image's layer.
type ImageFile struct {
	// Path is the absolute path in the image, e.g. /usr/local/bin/switchboard.
	Path string
	// Mode holds the permission bits (0 means 0o644 for a file, 0o755 for
	// a directory).
	Mode os.FileMode
	// Exactly one of these: Data (the contents), From (a file on the
	// host to copy), Link (a symbolic link's target), Dir (a directory).
	Data []byte
	From string
	Link string
	Dir  bool
}

// ImageConfig is the runtime part of an image's configuration (the OCI
// image config's "config" object).
type ImageConfig struct {
	Entrypoint, Cmd, Env []string
	// User is "uid[:gid]".
	User, WorkingDir string
}

// WriteImage writes to w an OCI image layout archive of one image named
// ref (a full reference, e.g. localhost/switchboard:test), linux/amd64,
// whose one uncompressed layer holds files (parent directories are added
// as needed).
func WriteImage(w io.Writer, ref string, files []ImageFile, cfg ImageConfig) error {
	layer, err := layerTar(files)
	if err != nil {
		return err
	}
	layerDesc := descriptor("application/vnd.oci.image.layer.v1.tar", layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC(),
		"config": map[string]any{
			"Entrypoint": cfg.Entrypoint, "Cmd": cfg.Cmd, "Env": cfg.Env,
			"User": cfg.User, "WorkingDir": cfg.WorkingDir,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	configDesc := descriptor("application/vnd.oci.image.config.v1+json", config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []ociDescriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	// containerd names the imported image after io.containerd.image.name.
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": ref[strings.LastIndex(ref, ":")+1:],
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []ociDescriptor{manifestDesc},
	})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	for _, e := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(configDesc), config},
		{blobPath(manifestDesc), manifest},
		{blobPath(layerDesc), layer},
	} {
		if err := put(e.name, e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// ociDescriptor is an OCI content descriptor.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func descriptor(mediaType string, blob []byte) ociDescriptor {
	sum := sha256.Sum256(blob)
	return ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(blob))}
}

func blobPath(d ociDescriptor) string {
	return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:")
}

// layerTar is the layer: files, with their parent directories first.
func layerTar(files []ImageFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var mkdir func(dir string, mode os.FileMode) error
	mkdir = func(dir string, mode os.FileMode) error {
		if dir == "/" || dirs[dir] {
			return nil
		}
		if err := mkdir(path.Dir(dir), 0o755); err != nil {
			return err
		}
		dirs[dir] = true
		return tw.WriteHeader(&tar.Header{Name: dir[1:] + "/", Mode: int64(mode), Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)})
	}
	sorted := slices.Clone(files)
	slices.SortStableFunc(sorted, func(a, b ImageFile) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range sorted {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("image file %q: want a clean absolute path", f.Path)
		}
		if err := mkdir(path.Dir(f.Path), 0o755); err != nil {
			return nil, err
		}
		hdr := &tar.Header{Name: f.Path[1:], ModTime: time.Unix(0, 0), Mode: int64(f.Mode)}
		var data []byte
		switch {
		case f.Dir:
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
			if err := mkdir(f.Path, os.FileMode(hdr.Mode)); err != nil {
				return nil, err
			}
			continue
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		case f.From != "":
			b, err := os.ReadFile(f.From)
			if err != nil {
				return nil, fmt.Errorf("image file %s: %w", f.Path, err)
			}
			data = b
		default:
			data = f.Data
		}
		if hdr.Typeflag != tar.TypeSymlink {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
