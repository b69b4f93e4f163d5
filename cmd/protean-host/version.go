package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

// buildVersion is set by `make build` (-ldflags -X main.buildVersion=…,
// from git describe), so a build says its commit even where the go
// command stamps none (-buildvcs=false, or no git).
var buildVersion string

// hostVersion names this build: buildVersion when set, else the module
// version when built from a tagged module (go install …@v1.2.3) or
// "devel" with the commit the go command stamped (-buildvcs, on by
// default in a git checkout) and "+modified" for uncommitted changes;
// then the Go version.
func hostVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = &debug.BuildInfo{}
	}
	return versionOf(buildVersion, bi)
}

func versionOf(build string, bi *debug.BuildInfo) string {
	if build != "" {
		return build + " " + bi.GoVersion
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+modified"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " " + rev + modified
	}
	return v + " " + bi.GoVersion
}

// cmdVersion prints the build.
func cmdVersion(_ context.Context, e *env, args []string) error {
	fs := e.flagSet("version")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "protean-host", hostVersion())
	return nil
}
