//! The workers the router sends requests to: the port they serve on, and
//! the networks their addresses must be in (B83).

use crate::cli::flags::ServeArgs;
use crate::cli::values::{cidr_list, port, CidrRange, ConfigError};

/// Where resumed actors' workers are reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workers {
    pub port: u16,
    /// The networks a worker's address must be in; empty: any.
    pub networks: Vec<CidrRange>,
}

impl Workers {
    pub(super) fn from_args(args: &ServeArgs) -> Result<Workers, ConfigError> {
        Ok(Workers {
            port: port("--worker-port", args.worker_port)?,
            networks: cidr_list("--worker-networks", &args.worker_networks)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::values::cidr_list;

    #[test]
    fn b83_cidr_ranges_contain_what_they_should() {
        let ranges = cidr_list("--worker-networks", "10.0.0.0/8,fd00::/8,192.168.1.7/32,0.0.0.0/0").unwrap();
        let contains = |i: usize, ip: &str| ranges[i].contains(ip.parse().unwrap());
        assert!(contains(0, "10.255.0.1") && !contains(0, "11.0.0.1") && contains(0, "::ffff:10.0.0.1"));
        assert!(contains(1, "fd12::1") && !contains(1, "fe80::1") && !contains(1, "10.0.0.1"));
        assert!(contains(2, "192.168.1.7") && !contains(2, "192.168.1.8"));
        assert!(contains(3, "8.8.8.8") && !contains(3, "::1"), "a /0 is every address of its family");
        assert!(cidr_list("--worker-networks", "").unwrap().is_empty());
    }
}
