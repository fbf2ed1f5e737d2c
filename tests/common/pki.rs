//! A throwaway PKI made with the openssl command at test time.

use std::path::PathBuf;
use std::process::Command;

/// A throwaway PKI: two CAs; a server certificate for `ateapi.test` only
/// (no IP), signed by `ca1`; client bundles signed by each CA.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("atenet-pki-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        for ca in ["ca1", "ca2"] {
            pki.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={ca}"),
            ]);
        }
        pki.issue("server", "ca1", "subjectAltName=DNS:ateapi.test");
        pki.issue("client1", "ca1", "extendedKeyUsage=clientAuth");
        pki.issue("client2", "ca2", "extendedKeyUsage=clientAuth");
        pki
    }

    pub fn openssl(&self, args: &[&str]) {
        let out =
            Command::new("openssl").args(args).current_dir(&self.dir).output().expect("openssl is installed");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `name.key` (P-256), its signing request `name.csr` for `CN=name`,
    /// and `name.ext`, the extensions a certificate for it gets.
    fn key_and_request(&self, name: &str, ext: &str) {
        std::fs::write(self.dir.join(format!("{name}.ext")), format!("{ext}\n")).unwrap();
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
    }

    pub fn issue(&self, name: &str, ca: &str, ext: &str) {
        self.key_and_request(name, ext);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ]);
        let bundle = [self.read(&format!("{name}.pem")), self.read(&format!("{name}.key"))].concat();
        std::fs::write(self.dir.join(format!("{name}.bundle")), bundle).unwrap();
    }

    /// As [`Pki::issue`], but valid from `not_before` to `not_after`
    /// (`YYYYMMDDHHMMSSZ`, UTC), dates in the past or the future included:
    /// `openssl ca` sets them as given (OpenSSL 3.0's `x509` has only
    /// `-days`, counted from now).
    pub fn issue_dated(&self, name: &str, ca: &str, ext: &str, not_before: &str, not_after: &str) {
        let config = "[ca]\ndefault_ca = dated\n[dated]\ndatabase = dated.index\nserial = dated.serial\n\
                      new_certs_dir = dated\ndefault_md = sha256\npolicy = any\nunique_subject = no\n\
                      [any]\ncommonName = supplied\n";
        std::fs::write(self.dir.join("dated.cnf"), config).unwrap();
        if !self.dir.join("dated.serial").exists() {
            std::fs::create_dir_all(self.dir.join("dated")).unwrap();
            std::fs::write(self.dir.join("dated.index"), "").unwrap();
            std::fs::write(self.dir.join("dated.serial"), "1000\n").unwrap();
        }
        self.key_and_request(name, ext);
        self.openssl(&[
            "ca",
            "-batch",
            "-notext",
            "-config",
            "dated.cnf",
            "-cert",
            &format!("{ca}.pem"),
            "-keyfile",
            &format!("{ca}.key"),
            "-in",
            &format!("{name}.csr"),
            "-out",
            &format!("{name}.pem"),
            "-startdate",
            not_before,
            "-enddate",
            not_after,
            "-extfile",
            &format!("{name}.ext"),
        ]);
        let bundle = [self.read(&format!("{name}.pem")), self.read(&format!("{name}.key"))].concat();
        std::fs::write(self.dir.join(format!("{name}.bundle")), bundle).unwrap();
    }

    /// Replaces `name` with a copy of `from` the way a rotation does:
    /// written beside it, then renamed over it.
    pub fn replace(&self, name: &str, from: &str) {
        let temp = self.path(&format!("{name}.next"));
        std::fs::copy(self.path(from), &temp).unwrap();
        std::fs::rename(&temp, self.path(name)).unwrap();
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(file)).unwrap()
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A file the test rotates: starts as a copy of `from`.
    pub fn rotating(&self, name: &str, from: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::copy(self.path(from), &path).unwrap();
        path
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
