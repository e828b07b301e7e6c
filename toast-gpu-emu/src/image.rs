//! What the emulator reads of a compiled module: its format and the names of
//! the functions it defines.
//!
//! The code itself is never run (the host build of the same source is), but
//! a module must be what the real compiler produced: a cubin (ELF), PTX
//! text, or an AMD code object (ELF, possibly inside a clang offload
//! bundle); and a function is found only when the module defines it, as
//! on a device. Like the drivers' `cuModuleLoadData` / `hipModuleLoadData`,
//! which take no length, the image is trusted to be as long as its headers
//! say.

use crate::EmuError;
use std::collections::BTreeSet;

const ELF_MAGIC: &[u8] = b"\x7fELF";
const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";

/// Larger than any code object we produce; a header saying otherwise is
/// corrupt.
const MAX_SIZE: u64 = 1 << 30;

/// A loaded module's format and the symbols it defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `"cubin"`, `"PTX"`, `"code object"` or `"offload bundle"`.
    pub format: &'static str,
    /// Every symbol name (ELF) or `.entry` name (PTX).
    pub symbols: BTreeSet<String>,
}

/// Whether the bytes at `p` start with `magic`, reading no further than
/// the first mismatch (so a short NUL-terminated text is never overrun).
///
/// # Safety
/// `p` is readable up to its first byte differing from `magic` (or the end
/// of `magic`).
unsafe fn starts_with(p: *const u8, magic: &[u8]) -> bool {
    magic.iter().enumerate().all(|(i, &m)| {
        // SAFETY: bytes before `i` matched `magic`, so byte `i` is readable
        // (the caller's contract).
        unsafe { *p.add(i) == m }
    })
}

/// Read a `T` at `p + off`.
///
/// # Safety
/// `p + off .. p + off + size_of::<T>()` is readable.
unsafe fn rd<T: Copy>(p: *const u8, off: u64) -> T {
    // SAFETY: the caller's contract; unaligned read.
    unsafe { (p.add(off as usize) as *const T).read_unaligned() }
}

fn corrupt(what: &str) -> EmuError {
    EmuError::InvalidImage(format!("a corrupt {what}"))
}

/// The symbol names of the ELF64 file at `p`.
///
/// # Safety
/// `p` is a complete ELF file (its headers' offsets and sizes lie inside).
unsafe fn elf_symbols(p: *const u8) -> Result<BTreeSet<String>, EmuError> {
    // SAFETY: (every read below) offsets and sizes come from the file's own
    // headers, bounded by MAX_SIZE; the caller guarantees they lie inside.
    unsafe {
        if rd::<u8>(p, 4) != 2 {
            return Err(EmuError::InvalidImage("not a 64-bit ELF file".into()));
        }
        let shoff: u64 = rd(p, 0x28);
        let shentsize = u64::from(rd::<u16>(p, 0x3A));
        let shnum = u64::from(rd::<u16>(p, 0x3C));
        if shentsize < 0x40 || shoff > MAX_SIZE {
            return Err(corrupt("ELF section table"));
        }
        let mut names = BTreeSet::new();
        for s in 0..shnum {
            let sh = shoff + s * shentsize;
            let ty: u32 = rd(p, sh + 4);
            if ty != 2 && ty != 11 {
                continue; // neither SHT_SYMTAB nor SHT_DYNSYM
            }
            let (off, size, entsize): (u64, u64, u64) =
                (rd(p, sh + 0x18), rd(p, sh + 0x20), rd(p, sh + 0x38));
            let link = u64::from(rd::<u32>(p, sh + 0x28));
            if link >= shnum || entsize < 24 || off > MAX_SIZE || size > MAX_SIZE {
                return Err(corrupt("ELF symbol table"));
            }
            let strsh = shoff + link * shentsize;
            let (stroff, strsize): (u64, u64) = (rd(p, strsh + 0x18), rd(p, strsh + 0x20));
            if stroff > MAX_SIZE || strsize > MAX_SIZE {
                return Err(corrupt("ELF string table"));
            }
            let strtab = std::slice::from_raw_parts(p.add(stroff as usize), strsize as usize);
            for e in 0..size / entsize {
                let name = u64::from(rd::<u32>(p, off + e * entsize));
                if name == 0 || name >= strsize {
                    continue;
                }
                let rest = &strtab[name as usize..];
                let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
                names.insert(String::from_utf8_lossy(&rest[..end]).into_owned());
            }
        }
        Ok(names)
    }
}

/// The `.entry` names of NUL-terminated PTX text at `p`.
///
/// # Safety
/// `p` is a NUL-terminated string.
unsafe fn ptx_entries(p: *const u8) -> BTreeSet<String> {
    // SAFETY: the caller's contract.
    let text = unsafe { std::ffi::CStr::from_ptr(p as *const std::ffi::c_char) };
    let text = text.to_string_lossy();
    let mut out = BTreeSet::new();
    let mut words = text.split(|c: char| c.is_whitespace() || c == '(');
    while let Some(w) = words.next() {
        if w == ".entry" {
            if let Some(n) = words.find(|w| !w.is_empty()) {
                out.insert(n.to_string());
            }
        }
    }
    out
}

/// Read a CUDA module image: a cubin or PTX.
///
/// # Safety
/// `p` is null, or a complete cubin, or NUL-terminated text.
pub unsafe fn read_cuda(p: *const u8) -> Result<Image, EmuError> {
    if p.is_null() {
        return Err(EmuError::InvalidValue("null module image".into()));
    }
    // SAFETY: a cubin has at least 4 bytes; a text stops at its NUL.
    if unsafe { starts_with(p, ELF_MAGIC) } {
        return Ok(Image {
            format: "cubin",
            // SAFETY: a complete cubin (the caller's contract).
            symbols: unsafe { elf_symbols(p)? },
        });
    }
    // SAFETY: not ELF, hence NUL-terminated text (the caller's contract).
    let symbols = unsafe { ptx_entries(p) };
    if symbols.is_empty() {
        return Err(EmuError::InvalidImage(
            "neither a cubin nor PTX with an .entry".into(),
        ));
    }
    Ok(Image {
        format: "PTX",
        symbols,
    })
}

/// Read a HIP module image: an AMD code object, or an offload bundle with
/// one for `amdgcn`.
///
/// # Safety
/// `p` is null, or a complete code object or offload bundle.
pub unsafe fn read_hip(p: *const u8) -> Result<Image, EmuError> {
    if p.is_null() {
        return Err(EmuError::InvalidValue("null module image".into()));
    }
    // SAFETY: both formats are longer than their magic; reading stops at the
    // first mismatch.
    if unsafe { starts_with(p, ELF_MAGIC) } {
        return Ok(Image {
            format: "code object",
            // SAFETY: a complete code object (the caller's contract).
            symbols: unsafe { elf_symbols(p)? },
        });
    }
    // SAFETY: not ELF, so by the contract `p` is an offload bundle, which begins with
    // BUNDLE_MAGIC; reading stops at the first mismatch.
    if !unsafe { starts_with(p, BUNDLE_MAGIC) } {
        return Err(EmuError::InvalidImage(
            "neither an AMD code object nor a clang offload bundle".into(),
        ));
    }
    // SAFETY: (the reads below) the bundle's header, whose entries' offsets and
    // sizes are bounded by MAX_SIZE and lie inside (the caller's contract).
    unsafe {
        let n: u64 = rd(p, 24);
        let mut at = 32u64;
        for _ in 0..n.min(64) {
            let (off, size, tlen): (u64, u64, u64) = (rd(p, at), rd(p, at + 8), rd(p, at + 16));
            if off > MAX_SIZE || size > MAX_SIZE || tlen > 4096 {
                return Err(corrupt("offload bundle"));
            }
            let triple = std::slice::from_raw_parts(p.add(at as usize + 24), tlen as usize);
            at += 24 + tlen;
            if triple.windows(6).any(|w| w == b"amdgcn") && size > 4 {
                let code = p.add(off as usize);
                if !starts_with(code, ELF_MAGIC) {
                    return Err(corrupt("offload bundle entry"));
                }
                return Ok(Image {
                    format: "offload bundle",
                    symbols: elf_symbols(code)?,
                });
            }
        }
    }
    Err(EmuError::InvalidImage(
        "an offload bundle with no amdgcn code object".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_and_garbage() {
        let ptx = b"//\n.version 8.0\n.target sm_80\n.visible .entry toast_a(\n.param .u64 x)\n{}\n.visible .entry toast_b(){}\0";
        // SAFETY: NUL-terminated.
        let i = unsafe { read_cuda(ptx.as_ptr()) }.unwrap();
        assert_eq!(i.format, "PTX");
        assert!(i.symbols.contains("toast_a") && i.symbols.contains("toast_b"));
        // SAFETY: NUL-terminated.
        let e = unsafe { read_cuda(c"hello".as_ptr() as *const u8) }.unwrap_err();
        assert!(matches!(e, EmuError::InvalidImage(_)));
        // SAFETY: NUL-terminated.
        let e = unsafe { read_hip(c"\x7fEL".as_ptr() as *const u8) }.unwrap_err();
        assert!(matches!(e, EmuError::InvalidImage(_)));
    }

    #[test]
    fn an_elf_file_lists_its_symbols() {
        // This test executable is an ELF64 file with a symbol table.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // SAFETY: a complete ELF file.
        let i = unsafe { read_cuda(exe.as_ptr()) }.unwrap();
        assert_eq!(i.format, "cubin");
        assert!(i.symbols.iter().any(|s| s.contains("toast_emu_run_")));
        // The same file as the amdgcn entry of a clang offload bundle, after
        // a host entry.
        let entries: [(&[u8], &[u8]); 2] = [
            (b"host-x86_64-unknown-linux", b"\x7fELF"),
            (b"hipv4-amdgcn-amd-amdhsa--gfx90a", &exe),
        ];
        let header = 24 + 8 + entries.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
        let mut bundle = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
        bundle.extend_from_slice(&2u64.to_le_bytes());
        let mut at = header;
        for (triple, code) in entries {
            for v in [at, code.len(), triple.len()] {
                bundle.extend_from_slice(&(v as u64).to_le_bytes());
            }
            bundle.extend_from_slice(triple);
            at += code.len();
        }
        for (_, code) in entries {
            bundle.extend_from_slice(code);
        }
        // SAFETY: a complete bundle.
        let b = unsafe { read_hip(bundle.as_ptr()) }.unwrap();
        assert_eq!((b.format, &b.symbols), ("offload bundle", &i.symbols));
    }
}
