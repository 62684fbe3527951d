//! A site's own certificate authority for the lab, made with openssl as an administrator would: a CA, a
//! server certificate for `127.0.0.1` (the registry and its proxy) and a client certificate, the client pair
//! named as containers-certs.d(5) wants it (`client.cert`, `client.key`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::process::run;

/// The files of the lab's CA, all in one directory.
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
    /// Makes the CA and both certificates in `dir`.
    pub fn make(dir: &Path) -> Result<SitePki> {
        std::fs::create_dir_all(dir)?;
        let ca_key = dir.join("ca.key");
        let pki = SitePki {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.cert"),
            client_key: dir.join("client.key"),
        };
        run(new_key_and(&ca_key)
            .args(["-x509", "-days", "2", "-subj", "/CN=pinboard lab site CA"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out"])
            .arg(&pki.ca))
        .context("openssl makes the lab CA")?;
        let sign = |name: &str, cert: &Path, key: &Path, extensions: &str| -> Result<()> {
            let request = dir.join(format!("{name}.csr"));
            let extfile = dir.join(format!("{name}.ext"));
            std::fs::write(&extfile, extensions)?;
            run(new_key_and(key)
                .args(["-subj", &format!("/CN={name}"), "-out"])
                .arg(&request))?;
            run(Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-in"])
                .arg(&request)
                .arg("-CA")
                .arg(&pki.ca)
                .arg("-CAkey")
                .arg(&ca_key)
                .args(["-CAcreateserial", "-extfile"])
                .arg(&extfile)
                .arg("-out")
                .arg(cert))
            .with_context(|| format!("openssl signs the lab's {name} certificate"))?;
            Ok(())
        };
        sign(
            "127.0.0.1",
            &pki.server_cert,
            &pki.server_key,
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )?;
        sign(
            "pinboard-lab-client",
            &pki.client_cert,
            &pki.client_key,
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )?;
        Ok(pki)
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
