//! Generates the protobuf messages from the hand-written subsets in `proto/`.
//!
//! Pure mode: the parser is protobuf-parse's own, so no `protoc` is needed on
//! the build machine. Service descriptors are written by hand in
//! `src/proto.rs`, because grpcio-compiler cannot emit protobuf v3 services.

fn main() {
    let inputs = [
        "proto/envoy/config/core/v3/base.proto",
        "proto/envoy/type/v3/http_status.proto",
        "proto/envoy/service/ext_proc/v3/external_processor.proto",
        "proto/ateapi/ateapi.proto",
    ];
    protobuf_codegen::Codegen::new()
        .pure()
        .include("proto")
        .inputs(inputs)
        .cargo_out_dir("protos")
        .run_from_script();
    println!("cargo:rerun-if-changed=proto");
}
