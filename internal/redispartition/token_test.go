package redispartition

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The one reading of a lease token, for the acquire's lost-reply check,
// the takeover's liveness check and the admin's status, is the inverse of
// Lease.Token, colons in the owner included.
func TestParseTokenReadsWhatTokenWrites(t *testing.T) {
	t.Parallel()
	for _, l := range []Lease{
		{Owner: "host-a", Generation: 1},
		{Owner: "web-1:4242:0a1b2c3d4e5f", Generation: 17}, // package owner's names
		{Owner: "", Generation: 3},
	} {
		owner, gen, ok := parseToken(l.Token())
		require.True(t, ok, l.Token())
		require.Equal(t, l.Owner, owner, l.Token())
		require.Equal(t, l.Generation, gen, l.Token())
	}
	for _, c := range []struct{ token, owner string }{
		{"host-a", "host-a"},       // no colon: the whole token names the holder
		{"host-a:", "host-a"},      // no generation
		{"host-a:1:x", "host-a:1"}, // the generation is after the last colon
		{"web-1:4242:abc", "web-1:4242"},
	} {
		owner, gen, ok := parseToken(c.token)
		require.False(t, ok, c.token)
		require.Equal(t, c.owner, owner, c.token)
		require.Zero(t, gen, c.token)
	}
}
