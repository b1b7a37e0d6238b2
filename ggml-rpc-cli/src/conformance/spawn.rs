//! `--spawn CMD`: the kit starts the server itself and starts it again when a case killed it,
//! so one run against a server that dies on some input (llama.cpp's, on its documented gaps)
//! still reaches every case.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::socket;

/// How long a (re)started server has to answer HELLO.
const START_WAIT: Duration = Duration::from_secs(60);

/// Why the server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// `sh -c CMD` did not start.
    #[error("cannot run `{command}`: {source}")]
    Run {
        /// The command.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// It started but did not answer HELLO in time.
    #[error("`{command}` did not answer HELLO on {addr} within {START_WAIT:?}")]
    NotReady {
        /// The command.
        command: String,
        /// Where it should listen.
        addr: SocketAddr,
    },
}

/// A server the kit started (`sh -c CMD`; let CMD `exec` the server so the kit's child is
/// the server). Killed when dropped.
pub struct Spawned {
    command: String,
    child: Option<Child>,
}

impl Spawned {
    /// Starts `command` and waits until `addr` answers HELLO.
    pub fn start(command: &str, addr: SocketAddr) -> Result<Spawned, SpawnError> {
        let mut spawned = Spawned {
            command: command.to_owned(),
            child: None,
        };
        spawned.restart(addr)?;
        Ok(spawned)
    }

    /// Ends the previous process (if still there) and starts a new one.
    pub fn restart(&mut self, addr: SocketAddr) -> Result<(), SpawnError> {
        self.stop();
        let child = Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| SpawnError::Run {
                command: self.command.clone(),
                source,
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + START_WAIT;
        while Instant::now() < deadline {
            if socket::alive(addr, Duration::from_secs(2)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(SpawnError::NotReady {
            command: self.command.clone(),
            addr,
        })
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.stop();
    }
}
