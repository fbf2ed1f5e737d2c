//! TLS credentials from files: reading them safely, checking them with
//! OpenSSL before gRPC sees them, and serving ext_proc over TLS with
//! certificates that rotate on disk.
//!
//! - `files`: reading one credential file (a regular file, bounded, never
//!   blocking) and the error that names its flag;
//! - `pem`: every certificate and key parsed by the `openssl` crate (the
//!   system OpenSSL gRPC links), and a key refused unless it matches its
//!   certificate (B60);
//! - `server`: the ext_proc listener's credentials, re-read while the
//!   router runs and handed to gRPC for new connections (B86).
//!
//! Used by `ateapi` (the control plane's channel) and by the assembly
//! (the ext_proc listener). May depend on nothing else of the crate.

pub mod files;
pub mod pem;
pub mod server;
