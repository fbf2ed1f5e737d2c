//! What build this is: the crate version and the git revision it was built
//! from (`build.rs` records it; `unknown` when the source had no git
//! metadata, as in a container build context without `.git`).

/// The crate version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git revision the binary was built from, e.g. `3cbc085` or
/// `3cbc085-dirty`; `unknown` without git.
pub const REVISION: &str = env!("ATENET_GIT_REVISION");

/// `atenet-router 0.1.0 (revision 3cbc085)`.
pub fn describe(program: &str) -> String {
    format!("{program} {VERSION} (revision {REVISION})")
}
