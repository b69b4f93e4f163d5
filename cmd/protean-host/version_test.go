package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersionNamesTheBuild(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "50a9c87aa1b2c3d4e5f60718293a4b5c6d7e8f90"}, {Key: "vcs.modified", Value: "true"}}}
	require.Equal(t, "devel 50a9c87aa1b2+modified go1.26.8", versionOf("", stamped))
	require.Equal(t, "v1.4.0-3-g50a9c87-dirty go1.26.8", versionOf("v1.4.0-3-g50a9c87-dirty", stamped), "make build's name wins")
	require.Equal(t, "v1.4.0 go1.26.8", versionOf("", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}}))
	require.Equal(t, "devel go1.26.8", versionOf("", &debug.BuildInfo{GoVersion: "go1.26.8"}), "no stamp: no commit")

	code, out, _ := cli(t, "version")
	require.Equal(t, 0, code)
	require.Regexp(t, `^protean-host \S+.* go1\.\d+`, out)
}
