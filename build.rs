//! Generates the protobuf messages from the hand-written subsets in `proto/`
//! and the official OpenTelemetry trace protos (`proto/opentelemetry/`),
//! and records the git revision the binary is built from.
//!
//! Pure mode: the parser is protobuf-parse's own, so no `protoc` is needed on
//! the build machine. Service descriptors are written by hand in
//! `src/proto.rs`, because grpcio-compiler cannot emit protobuf v3 services.

use std::process::Command;

fn main() {
    let inputs = [
        "proto/envoy/config/core/v3/base.proto",
        "proto/envoy/type/v3/http_status.proto",
        "proto/envoy/service/ext_proc/v3/external_processor.proto",
        "proto/ateapi/ateapi.proto",
        "proto/grpc/health/v1/health.proto",
        "proto/opentelemetry/proto/common/v1/common.proto",
        "proto/opentelemetry/proto/resource/v1/resource.proto",
        "proto/opentelemetry/proto/trace/v1/trace.proto",
        "proto/opentelemetry/proto/collector/trace/v1/trace_service.proto",
    ];
    protobuf_codegen::Codegen::new()
        .pure()
        .include("proto")
        .inputs(inputs)
        .cargo_out_dir("protos")
        .run_from_script();
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rustc-env=ATENET_GIT_REVISION={}", revision());
}

/// `ATENET_GIT_REVISION` when set (a container build has no `.git`), else
/// the checkout's commit, else `unknown`.
fn revision() -> String {
    println!("cargo:rerun-if-env-changed=ATENET_GIT_REVISION");
    if let Some(revision) = std::env::var("ATENET_GIT_REVISION").ok().filter(|r| !r.trim().is_empty()) {
        return revision.trim().to_string();
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // A new commit moves HEAD or the branch it points to. In a worktree
    // HEAD is the worktree's own, the branches are the common directory's.
    // (A path that does not exist would make cargo rerun this every time.)
    if let (Some(dir), Some(common)) =
        (git(&["rev-parse", "--git-dir"]), git(&["rev-parse", "--git-common-dir"]))
    {
        let reference = git(&["symbolic-ref", "-q", "HEAD"]).map(|r| format!("{common}/{r}"));
        let watched = [Some(format!("{dir}/HEAD")), reference, Some(format!("{common}/packed-refs"))];
        for path in watched.iter().flatten() {
            if std::path::Path::new(path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
}
