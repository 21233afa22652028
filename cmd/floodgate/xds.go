package main

import "errors"

// configFromXDS is where serve takes its configuration from an xDS
// server (envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW) rather than
// from --config: started as ratelimit, upstreamSettings reads the
// CONFIG_GRPC_XDS_* and XDS_CLIENT_* variables into x and leaves --config
// unset. The xDS configuration source plugs in here; until it does, that
// configuration type is refused with a clear error.
func configFromXDS(f *serveFlags, x *XDSSettings) error {
	return errors.New("$CONFIG_TYPE=GRPC_XDS_SOTW: this build of floodgate has no xDS configuration source; use CONFIG_TYPE=FILE with the domain files under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY")
}
