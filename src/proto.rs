//! Generated protobuf messages and hand-written gRPC method descriptors.
//!
//! Messages come from `proto/` through protobuf-codegen (see `build.rs`).
//! grpcio-compiler cannot emit services for protobuf v3, so the methods the
//! router speaks are declared here; only their paths and codecs matter on the
//! wire.

#![allow(clippy::all, missing_docs, unused_qualifications)]

include!(concat!(env!("OUT_DIR"), "/protos/mod.rs"));

use grpcio::{Marshaller, Method, MethodType};

use self::ateapi::{ResumeActorRequest, ResumeActorResponse};
use self::external_processor::{ProcessingRequest, ProcessingResponse};
use self::health::{HealthCheckRequest, HealthCheckResponse};
use self::trace_service::{ExportTraceServiceRequest, ExportTraceServiceResponse};

/// `envoy.service.ext_proc.v3.ExternalProcessor/Process`: one bidirectional
/// stream per downstream HTTP request.
pub const EXT_PROC_PROCESS: Method<ProcessingRequest, ProcessingResponse> = Method {
    ty: MethodType::Duplex,
    name: "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
    req_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
    resp_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
};

/// `ateapi.Control/ResumeActor`.
pub const ATEAPI_RESUME_ACTOR: Method<ResumeActorRequest, ResumeActorResponse> = Method {
    ty: MethodType::Unary,
    name: "/ateapi.Control/ResumeActor",
    req_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
    resp_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
};

/// `grpc.health.v1.Health/Check`, served on the ext_proc port (B84).
pub const HEALTH_CHECK: Method<HealthCheckRequest, HealthCheckResponse> = Method {
    ty: MethodType::Unary,
    name: "/grpc.health.v1.Health/Check",
    req_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
    resp_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
};

/// `opentelemetry.proto.collector.trace.v1.TraceService/Export`: OTLP/gRPC
/// trace export (B124).
pub const OTLP_TRACE_EXPORT: Method<ExportTraceServiceRequest, ExportTraceServiceResponse> = Method {
    ty: MethodType::Unary,
    name: "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    req_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
    resp_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
};
