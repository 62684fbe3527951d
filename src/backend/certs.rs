//! A site's CAs and client certificates for registries, found the containers way (containers-certs.d(5)),
//! so a registry signed by an internal CA needs nothing beyond what podman, skopeo, buildah and CRI-O use.
//!
//! For a registry `HOST[:PORT]`, the directory of that name under `/etc/containers/certs.d`,
//! `/etc/docker/certs.d` and `$HOME/.config/containers/certs.d`, or only under `--certs-dir DIR`, which
//! replaces those three as podman's `--cert-dir` does. In each: every `*.crt` is a CA trusted besides the
//! system store (or `SSL_CERT_FILE`, which replaces the store as it does for OpenSSL and Go); a `*.cert`
//! with the `*.key` of the same name is a client certificate presented to the registry, the first pair in
//! directory order then name order. A `*.cert` without its `*.key` (or the reverse) is an error, as it is
//! for containers/image. Key material is never logged or shown.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The system-wide directories, in the order they are read.
pub const SYSTEM_CERTS_DIRS: [&str; 2] = ["/etc/containers/certs.d", "/etc/docker/certs.d"];
/// The per-user directory, below `$HOME`.
pub const HOME_CERTS_DIR: &str = ".config/containers/certs.d";

/// Which certs.d directories to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertDirs {
    dirs: Vec<PathBuf>,
}

/// What certs.d holds for one registry.
#[derive(Clone, Default)]
pub struct SiteTls {
    /// CA certificates (DER), from `ca_files`.
    pub cas: Vec<CertificateDer<'static>>,
    pub ca_files: Vec<PathBuf>,
    pub client: Option<ClientCertificate>,
}

/// A client certificate and its key, read from `cert` and `key`.
#[derive(Clone)]
pub struct ClientCertificate {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The certificate chain, then the key, as PEM: what reqwest's `Identity::from_pem` takes.
    pub pem: Vec<u8>,
}

impl fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for SiteTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SiteTls")
            .field("ca_files", &self.ca_files)
            .field("client", &self.client)
            .finish()
    }
}

/// A certs.d file that cannot be used. The message names the file and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}; fix or remove it (containers-certs.d(5))", path.display())]
pub struct CertsError {
    pub path: PathBuf,
    pub problem: String,
}

impl CertDirs {
    /// `--certs-dir DIR` when given, else the system directories and `$HOME`'s.
    pub fn from_env(certs_dir: Option<PathBuf>) -> CertDirs {
        match certs_dir {
            Some(dir) => CertDirs { dirs: vec![dir] },
            None => {
                let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
                CertDirs::standard(home.map(PathBuf::from).as_deref())
            }
        }
    }

    /// The system directories, then `home`'s.
    pub fn standard(home: Option<&Path>) -> CertDirs {
        let mut dirs: Vec<PathBuf> = SYSTEM_CERTS_DIRS.iter().map(PathBuf::from).collect();
        dirs.extend(home.map(|h| h.join(HOME_CERTS_DIR)));
        CertDirs { dirs }
    }

    /// Only these directories.
    pub fn only(dirs: Vec<PathBuf>) -> CertDirs {
        CertDirs { dirs }
    }

    /// The directories, in the order read.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Where `registry`'s files go: `DIR/HOST[:PORT]` under the first directory.
    pub fn registry_dir(&self, registry: &str) -> Option<PathBuf> {
        self.dirs.first().map(|d| d.join(registry))
    }

    /// The CAs and the client certificate certs.d holds for `registry` (`HOST[:PORT]`, as the image
    /// reference spells it). Directories that do not exist are skipped.
    pub fn for_registry(&self, registry: &str) -> Result<SiteTls, CertsError> {
        let mut site = SiteTls::default();
        for dir in &self.dirs {
            let dir = dir.join(registry);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            names.sort();
            for path in &names {
                match path.extension().and_then(|e| e.to_str()) {
                    Some("crt") => {
                        site.cas.extend(read_certificates(path)?);
                        site.ca_files.push(path.clone());
                    }
                    Some("cert") => {
                        let key = path.with_extension("key");
                        if !names.contains(&key) {
                            return Err(problem(
                                path,
                                format!("a client certificate without its key {}", key.display()),
                            ));
                        }
                        if site.client.is_none() {
                            site.client = Some(read_client(path, &key)?);
                        }
                    }
                    Some("key") if !names.contains(&path.with_extension("cert")) => {
                        return Err(problem(
                            path,
                            format!(
                                "a key without its client certificate {}",
                                path.with_extension("cert").display()
                            ),
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(site)
    }
}

fn problem(path: &Path, problem: String) -> CertsError {
    CertsError {
        path: path.to_owned(),
        problem,
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CertsError> {
    std::fs::read(path).map_err(|e| problem(path, format!("cannot be read ({e})")))
}

/// Every PEM certificate in the file; none at all is an error.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertsError> {
    let bytes = read(path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(path, format!("is not a PEM certificate ({e})")))?;
    if certificates.is_empty() {
        return Err(problem(path, "holds no PEM certificate".into()));
    }
    Ok(certificates)
}

fn read_client(cert: &Path, key: &Path) -> Result<ClientCertificate, CertsError> {
    read_certificates(cert)?;
    let key_bytes = read(key)?;
    // Only whether it is a usable key: its content never goes into a message.
    let unusable = || {
        problem(
            key,
            "is not a PEM private key (PKCS#8, PKCS#1 or SEC1)".into(),
        )
    };
    let der = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|_| unusable())?;
    rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(der)
        .map_err(|_| unusable())?;
    let mut pem = read(cert)?;
    pem.push(b'\n');
    pem.extend_from_slice(&key_bytes);
    Ok(ClientCertificate {
        cert: cert.to_owned(),
        key: key.to_owned(),
        pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate and its key, made once by openssl for these tests.
    fn certificate_and_key(dir: &Path) -> (String, String) {
        let (key, cert) = (dir.join("made.key"), dir.join("made.crt"));
        let out = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=test", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl runs (scripts/setup installs it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = |p: &Path| std::fs::read_to_string(p).unwrap();
        let pair = (text(&cert), text(&key));
        std::fs::remove_file(cert).unwrap();
        std::fs::remove_file(key).unwrap();
        pair
    }

    #[test]
    fn standard_directories_come_in_order_and_certs_dir_replaces_them() {
        let dirs = CertDirs::standard(Some(Path::new("/home/a")));
        assert_eq!(
            dirs.dirs(),
            [
                PathBuf::from("/etc/containers/certs.d"),
                PathBuf::from("/etc/docker/certs.d"),
                PathBuf::from("/home/a/.config/containers/certs.d"),
            ]
        );
        let only = CertDirs::from_env(Some("/x".into()));
        assert_eq!(only.dirs(), [PathBuf::from("/x")]);
        assert_eq!(
            only.registry_dir("reg.local:5000"),
            Some(PathBuf::from("/x/reg.local:5000"))
        );
    }

    #[test]
    fn cas_from_every_directory_and_the_first_client_pair() {
        let root = tempfile::tempdir().unwrap();
        let (cert, key) = certificate_and_key(root.path());
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        for dir in [&a, &b] {
            std::fs::create_dir_all(dir.join("reg.local:5000")).unwrap();
        }
        let write = |path: PathBuf, text: &str| std::fs::write(path, text).unwrap();
        write(a.join("reg.local:5000/ca.crt"), &cert);
        write(a.join("reg.local:5000/README"), "not a certificate");
        write(b.join("reg.local:5000/other.crt"), &format!("{cert}{cert}"));
        write(b.join("reg.local:5000/client.cert"), &cert);
        write(b.join("reg.local:5000/client.key"), &key);
        let dirs = CertDirs::only(vec![a.clone(), b.clone(), root.path().join("missing")]);
        let site = dirs.for_registry("reg.local:5000").unwrap();
        assert_eq!(site.cas.len(), 3);
        assert_eq!(
            site.ca_files,
            [
                a.join("reg.local:5000/ca.crt"),
                b.join("reg.local:5000/other.crt")
            ]
        );
        let client = site.client.as_ref().unwrap();
        assert_eq!(client.cert, b.join("reg.local:5000/client.cert"));
        assert!(String::from_utf8_lossy(&client.pem).contains("PRIVATE KEY"));
        // Neither Debug shows the key.
        let debug = format!("{site:?}");
        assert!(
            debug.contains("client.key") && !debug.contains("PRIVATE KEY"),
            "{debug}"
        );
        // Another registry, or none of its files: nothing.
        assert!(dirs.for_registry("reg.local").unwrap().cas.is_empty());
    }

    #[test]
    fn unusable_files_are_errors_naming_the_file() {
        let root = tempfile::tempdir().unwrap();
        let (cert, key) = certificate_and_key(root.path());
        let dir = root.path().join("reg.local");
        std::fs::create_dir_all(&dir).unwrap();
        let dirs = CertDirs::only(vec![root.path().to_owned()]);
        let error = |files: &[(&str, &str)]| {
            for entry in std::fs::read_dir(&dir).unwrap() {
                std::fs::remove_file(entry.unwrap().path()).unwrap();
            }
            for (name, text) in files {
                std::fs::write(dir.join(name), text).unwrap();
            }
            dirs.for_registry("reg.local").unwrap_err().to_string()
        };
        let shown = |name: &str| dir.join(name).display().to_string();
        assert_eq!(
            error(&[("client.cert", &cert)]),
            format!(
                "{}: a client certificate without its key {}; fix or remove it (containers-certs.d(5))",
                shown("client.cert"),
                shown("client.key")
            )
        );
        assert!(error(&[("client.key", &key)]).starts_with(&format!(
            "{}: a key without its client certificate",
            shown("client.key")
        )));
        assert!(error(&[("ca.crt", "garbage")]).contains("ca.crt: holds no PEM certificate"));
        let broken_key = error(&[
            ("client.cert", &cert),
            (
                "client.key",
                "-----BEGIN PRIVATE KEY-----\nsecretstuff\n-----END PRIVATE KEY-----\n",
            ),
        ]);
        assert!(
            broken_key.contains("client.key: is not a PEM private key"),
            "{broken_key}"
        );
        assert!(!broken_key.contains("secretstuff"));
    }
}
