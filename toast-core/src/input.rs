//! Opening a file the tool reads as input (a configuration, a sky map, a
//! conformance case, a plugin, a kernel cache entry): [`open_regular`], the
//! one function every such reader goes through.
//!
//! A path can name something that is not a regular file: a named pipe
//! (FIFO), whose blocking `open` waits forever for a writer; a character
//! device (`/dev/zero`, a terminal), which never ends or waits for input;
//! a directory; a socket. Testing the path with `stat` before opening it
//! leaves a window in which it can be replaced, so on Linux the file is
//! opened with `O_NONBLOCK` (an `open` that cannot wait, on a FIFO with no
//! writer as on anything else), its type is read from the open descriptor
//! (`fstat`), and only a regular file is kept, with `O_NONBLOCK` cleared
//! again. Anything else is a [`NotRegularFile`] error naming the path and
//! what it is. A socket cannot be opened at all (`ENXIO`); the path's type
//! is then read with `stat` to say so. Elsewhere (no `O_NONBLOCK` through
//! this crate's dependencies) the path is tested with `stat` first.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// What a path names, when it is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A directory.
    Directory,
    /// A named pipe (FIFO).
    Fifo,
    /// A Unix-domain socket.
    Socket,
    /// A character device (`/dev/zero`, a terminal).
    CharDevice,
    /// A block device (a disk).
    BlockDevice,
    /// Any other kind of file.
    Other,
}

impl FileKind {
    /// The kind of `t` (`None`: a regular file).
    pub fn of(t: &std::fs::FileType) -> Option<FileKind> {
        if t.is_file() {
            return None;
        }
        if t.is_dir() {
            return Some(FileKind::Directory);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_fifo() {
                return Some(FileKind::Fifo);
            }
            if t.is_socket() {
                return Some(FileKind::Socket);
            }
            if t.is_char_device() {
                return Some(FileKind::CharDevice);
            }
            if t.is_block_device() {
                return Some(FileKind::BlockDevice);
            }
        }
        Some(FileKind::Other)
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a named pipe (FIFO)",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Other => "a special file",
        })
    }
}

/// A path that names something other than a regular file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{} is {kind}, not a regular file", path.display())]
pub struct NotRegularFile {
    /// The path as given.
    pub path: PathBuf,
    /// What it names.
    pub kind: FileKind,
}

impl From<NotRegularFile> for io::Error {
    fn from(e: NotRegularFile) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

/// The [`NotRegularFile`] inside `e`, if that is what `e` is.
pub fn not_regular(e: &io::Error) -> Option<&NotRegularFile> {
    e.get_ref()?.downcast_ref::<NotRegularFile>()
}

/// Open `path` for reading, only if it is a regular file (following
/// symbolic links), without ever blocking in `open` (see the module's
/// documentation). Anything else is an [`io::Error`] of kind
/// `InvalidInput` wrapping a [`NotRegularFile`] (see [`not_regular`]);
/// other failures are `open`'s own.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = match open_nonblocking(path) {
        Ok(f) => f,
        Err(e) => {
            // A socket cannot be opened (ENXIO): say what it is.
            if let Ok(meta) = std::fs::metadata(path) {
                if let Some(kind) = FileKind::of(&meta.file_type()) {
                    return Err(NotRegularFile {
                        path: path.to_path_buf(),
                        kind,
                    }
                    .into());
                }
            }
            return Err(e);
        }
    };
    if let Some(kind) = FileKind::of(&file.metadata()?.file_type()) {
        return Err(NotRegularFile {
            path: path.to_path_buf(),
            kind,
        }
        .into());
    }
    clear_nonblocking(&file)?;
    Ok(file)
}

/// Read all of the regular file `path` (see [`open_regular`]), refusing one
/// of more than `max_bytes` bytes (`InvalidData`, naming the path).
pub fn read_regular(path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_regular(path)?
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: more than {max_bytes} bytes", path.display()),
        ));
    }
    Ok(bytes)
}

#[cfg(target_os = "linux")]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(target_os = "linux")]
fn clear_nonblocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is the open descriptor `file` owns for this call;
    // F_GETFL reads its status flags and changes nothing.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETFL changes only the descriptor's status flags.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    // No O_NONBLOCK here: the type is tested before the open instead.
    if let Some(kind) = FileKind::of(&std::fs::metadata(path)?.file_type()) {
        return Err(NotRegularFile {
            path: path.to_path_buf(),
            kind,
        }
        .into());
    }
    File::open(path)
}

#[cfg(not(target_os = "linux"))]
fn clear_nonblocking(_file: &File) -> io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Read;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("toast-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn regular_files_open_and_read() {
        let d = scratch("regular");
        let p = d.join("a.txt");
        std::fs::write(&p, b"hello").unwrap();
        let mut s = String::new();
        open_regular(&p).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        assert_eq!(read_regular(&p, 5).unwrap(), b"hello");
        let e = read_regular(&p, 4).unwrap_err().to_string();
        assert!(e.contains("more than 4 bytes"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn special_files_are_named_not_opened() {
        let d = scratch("special");
        let fifo = d.join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let sock = d.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for (p, kind) in [
            (fifo.as_path(), FileKind::Fifo),
            (d.as_path(), FileKind::Directory),
            (sock.as_path(), FileKind::Socket),
            (Path::new("/dev/zero"), FileKind::CharDevice),
        ] {
            let e = open_regular(p).unwrap_err();
            let n = not_regular(&e).unwrap_or_else(|| panic!("{}: {e}", p.display()));
            assert_eq!(n.kind, kind);
            let msg = e.to_string();
            assert!(
                msg.contains(&p.display().to_string()) && msg.contains("not a regular file"),
                "{msg}"
            );
        }
        let e = open_regular(&d.join("absent")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
