//! The network namespace of a cluster lab: its kube-apiserver, etcd, controllers, containerd nodes and
//! kubelets run in it, so kubelets get the non-loopback node IPs they insist on while no traffic leaves this
//! machine. It has `lo` up and one end of a veth pair whose other end is in the host's namespace:
//! `10.77.N.254/24` on the host side (where the lab's registry and proxy listen for such a lab),
//! `10.77.N.1/24` on the lab side (the API server) plus one address per node. `N` is unique among the labs
//! running on the machine: the host-side interface `pblN` is created only if no other lab holds that name.
//!
//! The namespace belongs to a holder process (`unshare --net sleep`): when the holder and every process
//! started in the namespace are gone, the kernel deletes the namespace and the veth pair with it, also when
//! the test process died without cleaning up.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::process::{Proc, run, stop_all};

/// The first address of each node, counting up: `10.77.N.11`, `10.77.N.12`, ...
const FIRST_NODE_HOST: u8 = 11;

#[derive(Debug)]
pub struct LabNetwork {
    subnet: u8,
    holder: Proc,
    /// The last byte of the next node address.
    next_node_host: Mutex<u8>,
}

impl LabNetwork {
    /// Creates the namespace and its veth pair, with the holder's log in `lab_dir`.
    pub(crate) fn create(lab_dir: &Path) -> Result<LabNetwork> {
        let mut command = Command::new("unshare");
        command.args(["--net", "--", "sleep", "infinity"]);
        // Once `network` exists, dropping it (on any error below) stops the holder.
        let mut network = LabNetwork {
            subnet: 0,
            holder: Proc::spawn(
                "network namespace holder",
                command,
                &lab_dir.join("network.log"),
            )?,
            next_node_host: Mutex::new(FIRST_NODE_HOST),
        };
        let ours = std::fs::read_link("/proc/self/ns/net")?;
        let namespace = network.namespace();
        network.holder.wait_ready(Duration::from_secs(5), || {
            std::fs::read_link(&namespace).is_ok_and(|ns| ns != ours)
        })?;
        network.subnet = create_veth(network.holder.pid())?;
        let (lab_ip, host_ip) = (network.lab_ip(), network.host_ip());
        let lab_interface = network.lab_interface();
        network.run_inside(&["ip", "link", "set", "lo", "up"])?;
        network.run_inside(&[
            "ip",
            "addr",
            "add",
            &format!("{lab_ip}/24"),
            "dev",
            &lab_interface,
        ])?;
        network.run_inside(&["ip", "link", "set", &lab_interface, "up"])?;
        let host_interface = network.host_interface();
        run(Command::new("ip").args([
            "addr",
            "add",
            &format!("{host_ip}/24"),
            "dev",
            &host_interface,
        ]))?;
        run(Command::new("ip").args(["link", "set", &host_interface, "up"]))?;
        Ok(network)
    }

    /// `/proc/PID/ns/net` of the holder: what `nsenter --net=` takes.
    pub(crate) fn namespace(&self) -> PathBuf {
        let pid = self.holder.pid();
        PathBuf::from(format!("/proc/{pid}/ns/net"))
    }

    /// `program` to be run inside the namespace.
    pub(crate) fn command(&self, program: impl AsRef<OsStr>) -> Command {
        command_in(&self.namespace(), program)
    }

    fn run_inside(&self, args: &[&str]) -> Result<String> {
        run(self.command(args[0]).args(&args[1..]))
    }

    fn host_interface(&self) -> String {
        format!("pbl{}", self.subnet)
    }

    fn lab_interface(&self) -> String {
        format!("pbl{}lab", self.subnet)
    }

    /// `10.77.N.254`: the host's end of the veth.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, 254)
    }

    /// `10.77.N.1`: the lab's own address, where the API server listens.
    pub fn lab_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, 1)
    }

    /// `10.77.N.0/24`, as the API server's Service range: its first address, the `kubernetes` Service's
    /// ClusterIP, is then [`LabNetwork::lab_ip`], where the API server really listens.
    pub fn service_range(&self) -> String {
        format!("10.77.{}.0/24", self.subnet)
    }

    /// A new address in the namespace, for a node.
    pub(crate) fn add_node_ip(&self) -> Result<Ipv4Addr> {
        let mut next = self.next_node_host.lock().expect("node addresses");
        if *next >= 250 {
            bail!("no more node addresses in 10.77.{}.0/24", self.subnet);
        }
        let ip = Ipv4Addr::new(10, 77, self.subnet, *next);
        self.run_inside(&[
            "ip",
            "addr",
            "add",
            &format!("{ip}/24"),
            "dev",
            &self.lab_interface(),
        ])?;
        *next += 1;
        Ok(ip)
    }

    /// Takes a node's address away again.
    pub(crate) fn remove_node_ip(&self, ip: Ipv4Addr) -> Result<()> {
        self.run_inside(&[
            "ip",
            "addr",
            "del",
            &format!("{ip}/24"),
            "dev",
            &self.lab_interface(),
        ])?;
        Ok(())
    }
}

impl Drop for LabNetwork {
    fn drop(&mut self) {
        stop_all(std::slice::from_mut(&mut self.holder));
    }
}

/// `program` to be run inside the network namespace `namespace` (a `/proc/PID/ns/net`).
pub(crate) fn command_in(namespace: &Path, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net={}", namespace.display()))
        .arg("--")
        .arg(program);
    command
}

/// How many subnets past this process's first one the next lab's search starts.
static SUBNETS_PASSED: AtomicU32 = AtomicU32::new(0);

/// Creates the veth pair, its lab end in the namespace of process `pid`, for the first free subnet; the
/// search starts from one that depends on the test process, so that labs of several processes rarely try
/// the same ones, and moves on with each lab, so that a lab never gets the subnet one just dropped had (a
/// test checking that its lab's addresses are gone would find the next lab's).
fn create_veth(pid: u32) -> Result<u8> {
    let passed = SUBNETS_PASSED.load(Ordering::Relaxed);
    let start = std::process::id() % 250 + passed;
    for offset in 0..250 {
        let subnet = u8::try_from((start + offset) % 250 + 1).expect("at most 250");
        let out = Command::new("ip")
            .args([
                "link",
                "add",
                &format!("pbl{subnet}"),
                "type",
                "veth",
                "peer",
                "name",
            ])
            .arg(format!("pbl{subnet}lab"))
            .args(["netns", &pid.to_string()])
            .output()
            .context("running ip link add")?;
        if out.status.success() {
            SUBNETS_PASSED.fetch_max(passed + offset + 1, Ordering::Relaxed);
            return Ok(subnet);
        }
        let error = String::from_utf8_lossy(&out.stderr);
        if !error.contains("File exists") {
            bail!("ip link add pbl{subnet}: {error}");
        }
    }
    bail!("every lab subnet 10.77.1-250.0/24 is taken")
}
