//! A check of a plugin file before the dynamic loader sees it.
//!
//! `dlopen` maps a library's segments as its program headers describe them;
//! a file cut short (a truncated copy, a download that stopped) has segments
//! that extend past its end, and touching those pages kills the process with
//! `SIGBUS` before `dlopen` can report anything. So, before loading, the file
//! must be a regular file and, on ELF systems, a shared object of this
//! machine (class, byte order, architecture) whose header tables and every
//! segment lie within the file. Elsewhere (macOS, Windows) only the
//! regular-file test is made.
//!
//! The check reads at most the ELF header and the two header tables (each
//! at most 65535 entries of a size the header gives, and only once they are
//! known to lie within the file), so it takes bounded time whatever the file
//! holds. A file changed between this check and `dlopen` is not caught.

use std::path::Path;

/// Why `path` cannot be handed to the dynamic loader, or `None` when it can.
/// A missing file is the caller's concern (it is reported as missing).
pub(crate) fn check_library_file(path: &Path) -> Option<String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot read its metadata: {e}")),
    };
    if !meta.is_file() {
        return Some(format!(
            "not a regular file (a {})",
            describe_type(&meta.file_type())
        ));
    }
    check_format(path, meta.len())
}

fn describe_type(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "named pipe";
        }
        if t.is_socket() {
            return "socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "device";
        }
    }
    if t.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

#[cfg(any(target_os = "macos", target_os = "ios", windows))]
fn check_format(_path: &Path, _len: u64) -> Option<String> {
    None
}

#[cfg(not(any(target_os = "macos", target_os = "ios", windows)))]
fn check_format(path: &Path, len: u64) -> Option<String> {
    let mut file = match toast_core::input::open_regular(path) {
        Ok(f) => f,
        Err(e) => return Some(format!("cannot open it: {e}")),
    };
    let mut head = [0u8; 64];
    let n = match read_up_to(&mut file, &mut head) {
        Ok(n) => n,
        Err(e) => return Some(format!("cannot read it: {e}")),
    };
    let tables = match parse_header(&head[..n], len) {
        Ok(t) => t,
        Err(reason) => return Some(reason),
    };
    let ph = match read_at(&mut file, tables.ph_off, tables.ph_bytes()) {
        Ok(b) => b,
        Err(e) => return Some(format!("cannot read its program headers: {e}")),
    };
    check_segments(&tables, &ph, len)
        .and_then(|()| check_sections(&tables, len))
        .err()
}

/// Read into `buf` until it is full or the file ends; the bytes read.
#[cfg(not(any(target_os = "macos", target_os = "ios", windows)))]
fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(not(any(target_os = "macos", target_os = "ios", windows)))]
fn read_at(file: &mut std::fs::File, offset: u64, bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek};
    file.seek(std::io::SeekFrom::Start(offset))?;
    // `bytes` is at most 65535 * 65535 and lies within the file (checked).
    let mut buf = vec![0u8; bytes as usize];
    file.read_exact(&mut buf)?;
    Ok(buf)
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const ET_DYN: u16 = 3;

/// The class (`1`: 32-bit, `2`: 64-bit) of this build's objects.
const NATIVE_CLASS: u8 = if cfg!(target_pointer_width = "64") {
    2
} else {
    1
};
/// The data encoding (`1`: little-endian, `2`: big-endian).
const NATIVE_DATA: u8 = if cfg!(target_endian = "little") { 1 } else { 2 };

/// `e_machine` of this build, where known (otherwise it is not checked).
fn native_machine() -> Option<u16> {
    match std::env::consts::ARCH {
        "x86" => Some(3),
        "x86_64" => Some(62),
        "arm" => Some(40),
        "aarch64" => Some(183),
        "powerpc" => Some(20),
        "powerpc64" => Some(21),
        "s390x" => Some(22),
        "riscv32" | "riscv64" => Some(243),
        "loongarch64" => Some(258),
        _ => None,
    }
}

/// Where the header tables are, from a checked ELF header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tables {
    is64: bool,
    little: bool,
    ph_off: u64,
    ph_entsize: u64,
    ph_num: u64,
    sh_off: u64,
    sh_bytes: u64,
}

impl Tables {
    fn ph_bytes(&self) -> u64 {
        self.ph_entsize * self.ph_num
    }
    fn u16_at(&self, b: &[u8], at: usize) -> u16 {
        let v = [b[at], b[at + 1]];
        if self.little {
            u16::from_le_bytes(v)
        } else {
            u16::from_be_bytes(v)
        }
    }
    fn u32_at(&self, b: &[u8], at: usize) -> u32 {
        let v: [u8; 4] = b[at..at + 4].try_into().expect("4 bytes");
        if self.little {
            u32::from_le_bytes(v)
        } else {
            u32::from_be_bytes(v)
        }
    }
    fn u64_at(&self, b: &[u8], at: usize) -> u64 {
        let v: [u8; 8] = b[at..at + 8].try_into().expect("8 bytes");
        if self.little {
            u64::from_le_bytes(v)
        } else {
            u64::from_be_bytes(v)
        }
    }
    /// A word: 8 bytes in ELF64, 4 in ELF32.
    fn word_at(&self, b: &[u8], at: usize) -> u64 {
        if self.is64 {
            self.u64_at(b, at)
        } else {
            u64::from(self.u32_at(b, at))
        }
    }
}

/// Whether `[offset, offset + bytes)` lies within a file of `len` bytes.
fn within(offset: u64, bytes: u64, len: u64) -> bool {
    offset.checked_add(bytes).is_some_and(|end| end <= len)
}

/// Check the ELF header (`head`, the first up-to-64 bytes of a file of
/// `len` bytes): this machine's shared object, with both header tables
/// within the file.
fn parse_header(head: &[u8], len: u64) -> Result<Tables, String> {
    if head.len() < 16 || &head[..4] != ELF_MAGIC {
        return Err(format!(
            "not an ELF file (it starts with {:02x?}, not 7f 45 4c 46)",
            &head[..head.len().min(4)]
        ));
    }
    let (class, data) = (head[4], head[5]);
    if class != NATIVE_CLASS {
        return Err(format!(
            "ELF class {class} ({}), but this program is {}",
            bits(class),
            bits(NATIVE_CLASS)
        ));
    }
    if data != NATIVE_DATA {
        return Err(format!(
            "ELF data encoding {data} ({}), but this machine is {}",
            endian(data),
            endian(NATIVE_DATA)
        ));
    }
    let is64 = class == 2;
    let header_size = if is64 { 64 } else { 52 };
    if head.len() < header_size {
        return Err(format!(
            "truncated: the file has {len} bytes, fewer than an ELF header's {header_size}"
        ));
    }
    let t0 = Tables {
        is64,
        little: data == 1,
        ph_off: 0,
        ph_entsize: 0,
        ph_num: 0,
        sh_off: 0,
        sh_bytes: 0,
    };
    let e_type = t0.u16_at(head, 16);
    if e_type != ET_DYN {
        return Err(format!(
            "ELF type {e_type} ({}), not a shared object (3)",
            match e_type {
                0 => "none",
                1 => "relocatable object",
                2 => "executable",
                4 => "core dump",
                _ => "unknown",
            }
        ));
    }
    let machine = t0.u16_at(head, 18);
    if let Some(native) = native_machine() {
        if machine != native {
            return Err(format!(
                "built for ELF machine {machine}, but this machine ({}) is {native}",
                std::env::consts::ARCH
            ));
        }
    }
    // Offsets of e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize, e_shnum.
    let (phoff_at, shoff_at, rest_at) = if is64 { (32, 40, 54) } else { (28, 32, 42) };
    let ph_off = t0.word_at(head, phoff_at);
    let sh_off = t0.word_at(head, shoff_at);
    let ph_entsize = u64::from(t0.u16_at(head, rest_at));
    let ph_num = u64::from(t0.u16_at(head, rest_at + 2));
    let sh_entsize = u64::from(t0.u16_at(head, rest_at + 4));
    let sh_num = u64::from(t0.u16_at(head, rest_at + 6));
    let min_ph = if is64 { 56 } else { 32 };
    if ph_num == 0 {
        return Err("no program headers: nothing to load".into());
    }
    if ph_entsize < min_ph {
        return Err(format!(
            "program header entries of {ph_entsize} bytes, fewer than {min_ph}"
        ));
    }
    if !within(ph_off, ph_entsize * ph_num, len) {
        return Err(format!(
            "truncated: the program header table (bytes {ph_off}..{}) ends past the end \
             of the file ({len} bytes)",
            ph_off as u128 + (ph_entsize * ph_num) as u128
        ));
    }
    // A section table is optional for loading; where there is one it must
    // be whole (with `e_shnum` 0 the count is in the first entry: at least
    // that one must be present). Checked after the segments.
    let sh_bytes = if sh_off == 0 {
        0
    } else {
        sh_entsize * sh_num.max(1)
    };
    Ok(Tables {
        ph_off,
        ph_entsize,
        ph_num,
        sh_off,
        sh_bytes,
        ..t0
    })
}

/// Check that the section header table, if any, lies within the file.
fn check_sections(t: &Tables, len: u64) -> Result<(), String> {
    if t.sh_off != 0 && !within(t.sh_off, t.sh_bytes, len) {
        return Err(format!(
            "truncated: the section header table (bytes {}..{}) ends past the end of the \
             file ({len} bytes)",
            t.sh_off,
            t.sh_off as u128 + t.sh_bytes as u128
        ));
    }
    Ok(())
}

/// Check that every segment's file bytes lie within the file.
fn check_segments(t: &Tables, ph: &[u8], len: u64) -> Result<(), String> {
    // Offsets of p_offset and p_filesz within an entry.
    let (off_at, filesz_at) = if t.is64 { (8, 32) } else { (4, 16) };
    for i in 0..t.ph_num {
        let e = &ph[(i * t.ph_entsize) as usize..((i + 1) * t.ph_entsize) as usize];
        let p_type = t.u32_at(e, 0);
        let offset = t.word_at(e, off_at);
        let filesz = t.word_at(e, filesz_at);
        if !within(offset, filesz, len) {
            return Err(format!(
                "truncated: segment {i} (type 0x{p_type:x}) takes bytes {offset}..{} of the \
                 file, which has {len} bytes",
                offset as u128 + filesz as u128
            ));
        }
    }
    Ok(())
}

fn bits(class: u8) -> &'static str {
    match class {
        1 => "32-bit",
        2 => "64-bit",
        _ => "invalid class",
    }
}

fn endian(data: u8) -> &'static str {
    match data {
        1 => "little-endian",
        2 => "big-endian",
        _ => "invalid encoding",
    }
}

#[cfg(all(
    test,
    target_os = "linux",
    target_pointer_width = "64",
    target_endian = "little"
))]
mod tests {
    use super::*;

    /// A minimal header of this machine's shared object (64-bit,
    /// little-endian: the platforms these tests are built for).
    fn header(len_file: u64) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(ELF_MAGIC);
        h[4] = 2;
        h[5] = 1;
        h[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
        h[18..20].copy_from_slice(&native_machine().unwrap().to_le_bytes());
        h[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        h[40..48].copy_from_slice(&(len_file - 64).to_le_bytes()); // e_shoff
        h[54..56].copy_from_slice(&56u16.to_le_bytes());
        h[56..58].copy_from_slice(&1u16.to_le_bytes());
        h[58..60].copy_from_slice(&64u16.to_le_bytes());
        h[60..62].copy_from_slice(&1u16.to_le_bytes());
        h
    }

    #[test]
    fn header_checks_name_what_is_wrong() {
        let len = 64 + 56 + 64;
        let t = parse_header(&header(len), len).unwrap();
        assert_eq!((t.ph_off, t.ph_num, t.ph_entsize), (64, 1, 56));

        let e = parse_header(b"#!/bin/sh\necho hi\n", 19).unwrap_err();
        assert!(e.starts_with("not an ELF file"), "{e}");
        let mut h = header(len);
        h[4] = 1;
        let e = parse_header(&h, len).unwrap_err();
        assert!(e.contains("ELF class 1 (32-bit)"), "{e}");
        let mut h = header(len);
        h[16] = 2;
        let e = parse_header(&h, len).unwrap_err();
        assert!(e.contains("(executable), not a shared object"), "{e}");
        let mut h = header(len);
        h[18..20].copy_from_slice(&0xbeefu16.to_le_bytes());
        let e = parse_header(&h, len).unwrap_err();
        assert!(e.contains("ELF machine 48879"), "{e}");
        // Cut short: the section table (at the end) no longer fits.
        let t = parse_header(&header(len), len - 1).unwrap();
        let e = check_sections(&t, len - 1).unwrap_err();
        assert!(e.contains("section header table (bytes 120..184)"), "{e}");
        assert!(check_sections(&t, len).is_ok());
        let e = parse_header(&header(len)[..40], 40).unwrap_err();
        assert!(e.contains("fewer than an ELF header's 64"), "{e}");
        // Absurd offsets do not overflow.
        let mut h = header(len);
        h[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = parse_header(&h, len).unwrap_err();
        assert!(e.contains("program header table"), "{e}");
    }

    #[test]
    fn segments_past_the_end_are_refused() {
        let len = 64 + 56 + 64;
        let t = parse_header(&header(len), len).unwrap();
        let mut ph = vec![0u8; 56];
        ph[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        ph[32..40].copy_from_slice(&len.to_le_bytes());
        assert!(check_segments(&t, &ph, len).is_ok());
        ph[8..16].copy_from_slice(&1u64.to_le_bytes());
        let e = check_segments(&t, &ph, len).unwrap_err();
        assert!(e.contains("segment 0 (type 0x1) takes bytes 1..185"), "{e}");
        ph[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(check_segments(&t, &ph, len).is_err());
    }

    #[test]
    fn special_files_are_refused() {
        let e = check_library_file(Path::new("/")).unwrap();
        assert!(e.contains("not a regular file (a directory)"), "{e}");
    }
}
