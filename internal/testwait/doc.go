// Package testwait is how tests wait for something that should happen:
// on a condition or a channel, with one generous limit for the whole
// suite, and a diagnosis when the limit passes.
//
// A test never stands a fixed sleep or a tight budget for "it happened":
// under the race detector, or with another CPU-heavy job on the same two
// cores, a reload or a guest compile can take tens of seconds. The limit is
// therefore not a measure of how fast the code is, only of when to give up
// and say what was seen: [Limit] is 60 s, 180 s under -race, and
// $PROTEAN_TEST_WAIT_SCALE multiplies it (a float, e.g. 2 on a slow CI
// runner). When it expires, the test fails naming what it waited for and
// the last state the condition reported.
//
//	testwait.For(t, "the projector loaded", func() (bool, string) {
//		n := plugins(t, h)
//		return n == 5, fmt.Sprintf("%d plugins", n)
//	})
//	res := testwait.Recv(t, "the command's result", done)
//
// Conditions run on the test goroutine, so they may use require.
package testwait
