module github.com/muster-dev/muster/tools/floor

go 1.26.8

require google.golang.org/grpc v1.85.0

// The versions muster's own go.mod resolves, so that the floor runs on
// muster's stack.
require (
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
