package main

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/auth"
)

// TestCLIOperatesThroughTheAPI: the CLI with --url asks a running host's
// operations API with the key in PROTEAN_API_KEY, and the host decides
// from the key. On PostgreSQL and Redis a poison entry halts shop's
// client_orders partition order:c-poison: shop's operator lists it, lab's
// does not and is refused its skip (exit 1, "forbidden"), shop's skips
// it, and protean-host audit shows shop's skip under shop's key. Without
// a key, the host's 401 comes back as a message naming PROTEAN_API_KEY.
func TestCLIOperatesThroughTheAPI(t *testing.T) {
	h, f := poisonedHost(t)
	url := "http://" + h.addr
	as := func(principal string, args ...string) (int, string, string) {
		t.Helper()
		t.Setenv(envAPIKey, f.keys[principal])
		return cli(t, append(args, "--url", url)...)
	}
	haltedRow := regexp.MustCompile(`(?m)^order\s+c-poison\s+client_orders\s+\S+\s+\S+\s+\d+\s+\d+\s+halted$`)
	eventually(t, h, "order:c-poison halted", func() (bool, string) {
		_, out, errs := as("shop-operator", "partitions", "list")
		return haltedRow.MatchString(out), out + errs
	})

	code, out, errs := as("lab-operator", "partitions", "list")
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "c-poison", "lab's operator sees only lab's partitions")
	code, out, errs = as("lab-operator", "partitions", "skip", "order", "c-poison", "--reason", "not mine")
	require.Equal(t, 1, code, out)
	require.Contains(t, errs, "forbidden")

	code, out, errs = as("shop-operator", "partitions", "inspect", "order", "c-poison")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "partition order c-poison  group client_orders  state halted")
	code, out, errs = as("shop-operator", "partitions", "skip", "order", "c-poison", "--reason", "a bad entry")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "for group client_orders; acked: true")
	require.Regexp(t, `audit entry \d+: skip order:c-poison group client_orders \(tenant shop\)`, out)

	shopKey := auth.KeyID(auth.Hash(f.keys["shop-operator"]))
	code, out, errs = as("shop-operator", "audit")
	require.Equal(t, 0, code, errs)
	require.Regexp(t, fmt.Sprintf(`(?m)^\d+\s+\S+\s+key:%s\s+shop\s+partitions.skip\s+order:c-poison group client_orders\s+ok\s+a bad entry$`, shopKey), out)
	code, out, errs = as("lab-operator", "audit")
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "c-poison", "lab's operator reads lab's audit entries only")

	code, out, errs = as("none", "partitions", "list")
	require.Equal(t, 1, code, out)
	require.Contains(t, errs, "401")
	require.Contains(t, errs, "set the environment variable PROTEAN_API_KEY")
}
