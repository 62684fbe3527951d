//! Certificate authorities for the lab, made with openssl as an administrator would: a site's own CA with a
//! server certificate for the registry's address (the registry and its proxy) and a client certificate, the
//! client pair named as containers-certs.d(5) wants it (`client.cert`, `client.key`); and, for a cluster lab,
//! the cluster's CA, which signs the API server's serving certificate and the kubelets' client certificates.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::process::run;

/// The files of the lab's site CA, all in one directory.
#[derive(Clone, Debug)]
pub struct SitePki {
    /// The CA certificate (PEM): what goes into certs.d as `ca.crt`.
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl SitePki {
    /// Makes the CA and both certificates in `dir`, the server's for `server_ip`.
    pub fn make(dir: &Path, server_ip: IpAddr) -> Result<SitePki> {
        let ca = Ca::make(dir, "pinboard lab site CA")?;
        let (server_cert, server_key) = ca.sign(
            "server",
            &format!("/CN={server_ip}"),
            &format!(
                "subjectAltName=IP:{server_ip}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
            ),
        )?;
        let (client_crt, client_key) = ca.sign(
            "client",
            "/CN=pinboard-lab-client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )?;
        // The name containers-certs.d(5) wants for a client certificate.
        let client_cert = dir.join("client.cert");
        std::fs::rename(&client_crt, &client_cert)?;
        Ok(SitePki {
            ca: ca.cert,
            server_cert,
            server_key,
            client_cert,
            client_key,
        })
    }
}

/// A certificate authority: its certificate and key (PEM) in a directory, where the certificates it signs
/// go too.
#[derive(Clone, Debug)]
pub struct Ca {
    /// The CA certificate (PEM).
    pub cert: PathBuf,
    key: PathBuf,
    dir: PathBuf,
}

impl Ca {
    /// Makes a CA called `name` (its subject's CN) in `dir`: `ca.crt` and `ca.key`.
    pub fn make(dir: &Path, name: &str) -> Result<Ca> {
        std::fs::create_dir_all(dir)?;
        let ca = Ca {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
            dir: dir.to_owned(),
        };
        run(new_key_and(&ca.key)
            .args(["-x509", "-days", "2", "-subj", &format!("/CN={name}")])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out"])
            .arg(&ca.cert))
        .with_context(|| format!("openssl makes the {name}"))?;
        Ok(ca)
    }

    /// Signs a new key's certificate for `subject` (`/O=…/CN=…`) with the X.509 `extensions` (openssl's
    /// extfile syntax); returns the paths of `<file>.crt` and `<file>.key` in the CA's directory.
    pub fn sign(&self, file: &str, subject: &str, extensions: &str) -> Result<(PathBuf, PathBuf)> {
        let (cert, key) = (
            self.dir.join(format!("{file}.crt")),
            self.dir.join(format!("{file}.key")),
        );
        let request = self.dir.join(format!("{file}.csr"));
        let extfile = self.dir.join(format!("{file}.ext"));
        std::fs::write(&extfile, extensions)?;
        run(new_key_and(&key)
            .args(["-subj", subject, "-out"])
            .arg(&request))?;
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(&request)
            .arg("-CA")
            .arg(&self.cert)
            .arg("-CAkey")
            .arg(&self.key)
            .args(["-CAcreateserial", "-extfile"])
            .arg(&extfile)
            .arg("-out")
            .arg(&cert))
        .with_context(|| format!("openssl signs the lab's {file} certificate"))?;
        Ok((cert, key))
    }
}

/// A self-signed RSA certificate `cert` for `subject` (`/CN=…`) and its key `key`, both PEM.
pub(crate) fn self_signed(key: &Path, cert: &Path, subject: &str) -> Result<()> {
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", subject, "-keyout"])
        .arg(key)
        .arg("-out")
        .arg(cert))
    .with_context(|| format!("openssl makes a self-signed certificate for {subject}"))?;
    Ok(())
}

/// `openssl req -newkey ec (P-256) -nodes -keyout KEY`, to be completed by the caller.
fn new_key_and(key: &Path) -> Command {
    let mut command = Command::new("openssl");
    command
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
        ])
        .arg(key);
    command
}
