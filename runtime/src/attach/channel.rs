//! The agent's end of the session socket: whole messages (see `wire`), with the descriptor
//! the session's spec carries.
//!
//! Normal context, on the agent thread, or on the thread writing a batch for it (the agent
//! itself): never two at once.

use crate::attach::wire::{FromAgent, ToAgent, MAX_MESSAGE};
use crate::base::socket;
use crate::base::sys::{self, Errno};

/// Why a message did not come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// `uprobe-run` closed its end (it ended).
    Closed,
    Garbled,
    Io(Errno),
}

/// A connected session socket.
pub struct Channel {
    pub fd: i32,
}

impl Channel {
    pub fn send(&self, message: &FromAgent) -> Result<(), Errno> {
        socket::send_nosignal(self.fd, message.encode().as_bytes()).map(drop)
    }

    /// The next message, and the descriptor it carried (closed here unless asked for).
    pub fn recv(&self) -> Result<(ToAgent, Option<i32>), RecvError> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let (n, fd) = socket::recv_with_fd(self.fd, &mut buf).map_err(RecvError::Io)?;
        if n == 0 {
            return Err(RecvError::Closed);
        }
        match core::str::from_utf8(&buf[..n]).ok().and_then(ToAgent::decode) {
            Some(message) => Ok((message, fd)),
            None => {
                if let Some(fd) = fd {
                    sys::close(fd);
                }
                Err(RecvError::Garbled)
            }
        }
    }

    /// Sends `message` and waits for the answer.
    pub fn ask(&self, message: &FromAgent) -> Result<ToAgent, RecvError> {
        self.send(message).map_err(RecvError::Io)?;
        let (answer, fd) = self.recv()?;
        if let Some(fd) = fd {
            sys::close(fd);
        }
        Ok(answer)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        sys::close(self.fd);
    }
}
