//! A plain lab node's containerd run as systemd runs its unit, so that `systemctl restart containerd` (what
//! `pinboard lazy … --restart` runs) restarts it: a supervisor, itself a lab process, starts containerd
//! and, on SIGHUP, stops it (SIGTERM, as systemd does) and starts it again; a `systemctl` for the tests to
//! put first on pinboard's `PATH` sends that SIGHUP and returns once the new containerd serves, as
//! `systemctl restart` returns once a `Type=notify` unit is ready. The supervisor and containerd are one
//! process group: stopping it (or killing it, [`super::Lab::restart_node`]) reaches both.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use super::runtime::Runtime;

/// The supervisor, run by bash: `$1` containerd's config, `$2` where it keeps containerd's PID, `$3` where
/// it keeps its own.
const SUPERVISOR: &str = r#"# containerd as its systemd unit runs it (tests/it/support/unit.rs).
config=$1 pidfile=$2
echo $$ >"$3"
start() {
  containerd --config "$config" &
  child=$!
  echo "$child" >"$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
}
stop() { kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; }
trap 'stop; start' HUP
trap 'stop; exit 0' TERM INT
start
# A trapped signal ends `wait` early; the loop ends when containerd exits by itself.
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
"#;

/// A node's unit: its supervisor's files and its `systemctl`.
#[derive(Clone, Debug)]
pub struct Unit {
    script: PathBuf,
    containerd_pid: PathBuf,
    supervisor_pid: PathBuf,
    /// The directory holding `systemctl`.
    pub bin: PathBuf,
    log: PathBuf,
}

impl Unit {
    /// The unit of the node in `node_dir` whose containerd serves on `socket`: the supervisor's script and
    /// the `systemctl` written.
    pub(crate) fn write(node_dir: &Path, socket: &Path, runtime: Runtime) -> Result<Unit> {
        let dir = node_dir.join("unit");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        let unit = Unit {
            script: dir.join("supervise.sh"),
            containerd_pid: dir.join("containerd.pid"),
            supervisor_pid: dir.join("supervisor.pid"),
            log: dir.join("systemctl.log"),
            bin,
        };
        std::fs::write(&unit.script, SUPERVISOR)?;
        let systemctl = format!(
            r#"#!/bin/sh
# systemctl for lab node's containerd unit (tests/it/support/unit.rs)
printf '%s\n' "$*" >> '{log}'
if [ "$2" != containerd ]; then
  echo "Failed to $1 $2.service: Unit $2.service not found." >&2
  exit 5
fi
if [ "$1" != restart ]; then
  echo "Unknown command verb $1." >&2
  exit 1
fi
old=$(cat '{pid}')
kill -HUP "$(cat '{supervisor}')" || exit 1
tries=0
until [ "$(cat '{pid}' 2>/dev/null)" != "$old" ] && '{ctr}' --address '{socket}' version >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -gt 1200 ]; then
    echo "Job for containerd.service failed because a timeout was exceeded." >&2
    exit 1
  fi
  sleep 0.05
done
"#,
            log = unit.log.display(),
            pid = unit.containerd_pid.display(),
            supervisor = unit.supervisor_pid.display(),
            socket = socket.display(),
            ctr = runtime.program("ctr")?.display(),
        );
        let path = unit.bin.join("systemctl");
        std::fs::write(&path, systemctl)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(unit)
    }

    /// The supervisor's command line, starting containerd with `config`.
    pub(crate) fn command(&self, config: &Path) -> Command {
        let mut command = Command::new("bash");
        super::process::hup_trappable(&mut command)
            .arg(&self.script)
            .arg(config)
            .arg(&self.containerd_pid)
            .arg(&self.supervisor_pid);
        command
    }

    /// The command lines `systemctl` was run with, in order.
    pub fn systemctl_calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}
