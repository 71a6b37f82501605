//! Passing file descriptors over a Unix socket (SCM_RIGHTS): how an owner
//! hands a segment's memfd to a local peer. Every fd a message carries is
//! received and owned, so the ones a reader does not want are closed (taking
//! only the first would leak the others).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Most fds one message may carry (sized into [`ControlBuf`]).
const MAX_FDS: usize = 16;
/// Room for the control message of [`MAX_FDS`] fds: CMSG_SPACE(16 * 4) is
/// 80 bytes; u64 storage keeps it aligned for cmsghdr.
type ControlBuf = [u64; 12];

/// sendmsg with `fds` attached (SCM_RIGHTS; none when empty).
pub(super) fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} fds in one message (at most {MAX_FDS})", fds.len()),
        ));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf: ControlBuf = [0; 12];
    // SAFETY: msghdr is plain data; every pointer in it outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is pure arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        // SAFETY: the control buffer holds CMSG_SPACE(MAX_FDS fds) bytes and
        // `fds` has at most MAX_FDS entries (checked above).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            let data = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, &fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), fd);
            }
        }
    }
    // SAFETY: valid socket and message.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// recvmsg that also takes every fd passed with SCM_RIGHTS, in order (each
/// one owned: dropping the ones not wanted closes them). A message whose fds
/// did not all fit (MSG_CTRUNC; the kernel closed the rest) is an error, and
/// the fds that did arrive are closed.
fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf: ControlBuf = [0; 12];
    // SAFETY: as in send_with_fds.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: valid socket and message buffers.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel filled in; an
    // SCM_RIGHTS message's data is cmsg_len - CMSG_LEN(0) bytes of fds, each
    // one a fresh descriptor this process now owns.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(std::io::Error::other(format!(
            "more than {MAX_FDS} fds in one message"
        )));
    }
    Ok((n as usize, fds))
}

/// [`recv_with_fds`] for a message that should carry at most one fd: the
/// first is kept, any others are closed.
pub(super) fn recv_first_fd(
    sock: RawFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let (n, fds) = recv_with_fds(sock, buf)?;
    // Dropping the rest of the iterator closes every other fd.
    Ok((n, fds.into_iter().next()))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream as StdUnixStream;

    use super::*;
    use crate::SharedRegion;

    fn region_with(byte: u8) -> SharedRegion {
        let r = SharedRegion::create("fd-passing", 4096).unwrap();
        // SAFETY: fresh region, nobody else holds it.
        unsafe { r.slice_mut(0, 4096).unwrap() }.fill(byte);
        r
    }

    /// A message with several fds yields every one of them, not only its first.
    #[test]
    fn every_fd_of_a_multi_fd_message_arrives_and_is_usable() {
        let (a, b) = StdUnixStream::pair().unwrap();
        let regions: Vec<SharedRegion> = (1..=3u8).map(region_with).collect();
        let raw: Vec<RawFd> = regions.iter().map(|r| r.raw_fd()).collect();
        assert_eq!(send_with_fds(a.as_raw_fd(), b"map", &raw).unwrap(), 3);
        let mut buf = [0u8; 3];
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((n, &buf), (3, b"map"));
        assert_eq!(fds.len(), 3, "every fd of the message arrives");
        for (fd, want) in fds.into_iter().zip(1..=3u8) {
            let mapped = SharedRegion::from_fd(fd, 4096).unwrap();
            // SAFETY: the sender does not write while we read.
            let bytes = unsafe { mapped.slice(0, 4096).unwrap() };
            assert!(
                bytes.iter().all(|&x| x == want),
                "fd {want} maps its own region"
            );
        }
    }

    /// The fds a reader does not want are closed, not leaked: once the sender
    /// closes its end of a pipe, the pipe reads EOF only if no copy of that end
    /// survived in the receiver.
    #[test]
    fn fds_not_wanted_are_closed() {
        let (a, b) = StdUnixStream::pair().unwrap();
        let mut pipe = [0 as RawFd; 2];
        // SAFETY: plain syscall into a 2-int array.
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
            0
        );
        // SAFETY: fresh fds we own.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let region = region_with(7);
        send_with_fds(a.as_raw_fd(), b"x", &[region.raw_fd(), wr.as_raw_fd()]).unwrap();
        drop(wr);
        let mut buf = [0u8; 1];
        let (n, first) = recv_first_fd(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(n, 1);
        let mapped = SharedRegion::from_fd(first.unwrap(), 4096).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { mapped.slice(0, 1).unwrap() }, &[7]);
        let mut byte = [0u8; 1];
        // SAFETY: valid fd and buffer.
        let got = unsafe { libc::read(rd.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
        assert_eq!(got, 0, "EOF: the pipe's write end passed along was closed");
    }

    #[test]
    fn too_many_fds_are_refused_by_the_sender() {
        let (a, _b) = StdUnixStream::pair().unwrap();
        let region = region_with(1);
        let raw = vec![region.raw_fd(); MAX_FDS + 1];
        assert!(send_with_fds(a.as_raw_fd(), b"x", &raw).is_err());
    }
}
