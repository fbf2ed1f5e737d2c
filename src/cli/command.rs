//! The commands: what `atenet-router <command> [<flags>]` asks for. The
//! flags parse in [`crate::cli::flags`]; their values are validated into a
//! [`Config`] here, before anything else runs.

use std::ffi::OsString;

use crate::cli::config::{Config, ConfigError, Purpose};
use crate::cli::flags::{parse_flags, FlagsError};

/// The top-level help.
pub const HELP: &str = "Usage: atenet-router <command> [<flags>]

Envoy ext_proc router that resumes actors through ateapi and parks requests
through transient worker-pool saturation.

Commands:
  serve         Run the router: the ext_proc server Envoy calls for every request.
  envoy-config  Print the Envoy v3 bootstrap (YAML) matching the same flags.
  version       Print the version and the git revision it was built from.

Both serve and envoy-config take the same flags; see `atenet-router serve --help`.
envoy-config needs no ateapi credentials: the bootstrap names none.
";

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Run the router.
    Serve(Box<Config>),
    /// Print the Envoy bootstrap for this configuration.
    EnvoyConfig(Box<Config>),
    /// Print this text (on stdout, exit 0).
    Help(String),
    /// Print the version.
    Version,
    /// No command: print the help on stderr and exit 2.
    Usage,
}

/// The arguments after the program name as text, or which one is not
/// valid UTF-8 (shown lossily). Every flag takes text, and a lossy reading
/// would name another file or host than the operator's (B131).
pub fn utf8_args(args: impl IntoIterator<Item = OsString>) -> Result<Vec<String>, String> {
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| {
            arg.into_string()
                .map_err(|arg| format!("argument {} is not valid UTF-8: {:?}", i + 1, arg.to_string_lossy()))
        })
        .collect()
}

/// Reads the command line (without the program name).
pub fn parse_command(args: &[String]) -> Result<Command, ConfigError> {
    let command = args.first().map(String::as_str).unwrap_or("");
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    let config = |command, purpose| match parse_flags(command, &rest) {
        Ok(flags) => Config::from_args_for(&flags, purpose).map(Box::new).map(Ok),
        Err(FlagsError::Help(text)) => Ok(Err(text)),
        Err(FlagsError::Invalid(e)) => Err(ConfigError::new(e)),
    };
    match command {
        "serve" => Ok(config(command, Purpose::Serve)?.map_or_else(Command::Help, Command::Serve)),
        // The bootstrap names no ateapi setting: no credentials needed.
        "envoy-config" => match config(command, Purpose::Bootstrap)? {
            // `serve --port-extproc 0` takes any free port, which a
            // bootstrap written beforehand cannot name (B70).
            Ok(config)
                if config.envoy.routers.is_empty()
                    && config.extproc.listen.tcp().is_some_and(|a| a.port() == 0) =>
            {
                Err(ConfigError::new(
                    "envoy-config needs the ext_proc port Envoy connects to: \
                 --port-extproc 0 (any free port) cannot be written into a bootstrap",
                ))
            }
            Ok(config) => {
                // Envoy's side of ext_proc TLS is checked here only (B86).
                config.envoy.router_tls(&config.extproc)?;
                if !config.envoy.routers.is_empty() {
                    crate::cli::fleet::check_fleet_drain_delay(config.drain.delay)
                        .map_err(ConfigError::new)?;
                }
                Ok(Command::EnvoyConfig(config))
            }
            Err(help) => Ok(Command::Help(help)),
        },
        "help" | "--help" | "-h" | "version" | "--version" | "-V" if !rest.is_empty() => {
            Err(ConfigError::new(format!("{command} takes no arguments, got {rest:?}")))
        }
        "help" | "--help" | "-h" => Ok(Command::Help(HELP.to_string())),
        "version" | "--version" | "-V" => Ok(Command::Version),
        "" => Ok(Command::Usage),
        other => Err(ConfigError::new(format!(
            "unknown command {other:?} (expected serve, envoy-config or version)"
        ))),
    }
}
