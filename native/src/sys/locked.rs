//! Locked memory for keys.

use std::marker::PhantomData;
use std::ptr::NonNull;

use super::{Errno, last_errno};

/// A value in its own anonymous mapping, locked in RAM (mlock: never swapped), left out of
/// core dumps (MADV_DONTDUMP), and overwritten with zeros before it is unmapped.
pub struct LockedBox<T> {
    ptr: NonNull<T>,
    len: usize,
    _owns: PhantomData<T>,
}

// SAFETY: LockedBox owns its T exclusively (like Box<T>), so it is Send/Sync when T is.
unsafe impl<T: Send> Send for LockedBox<T> {}
// SAFETY: as above; shared access only hands out &T.
unsafe impl<T: Sync> Sync for LockedBox<T> {}

impl<T> LockedBox<T> {
    pub fn new(value: T) -> Result<Self, Errno> {
        let page = 4096usize;
        let size = std::mem::size_of::<T>().max(1);
        let len = size.div_ceil(page) * page;
        assert!(std::mem::align_of::<T>() <= page);
        // SAFETY: an anonymous private mapping of `len` bytes, not aliasing anything.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(last_errno());
        }
        // SAFETY: [addr, addr + len) is the mapping made just above.
        let locked = unsafe { libc::mlock(addr, len) };
        if locked != 0 {
            let err = last_errno();
            // SAFETY: unmapping the mapping made above, which nothing references yet.
            unsafe { libc::munmap(addr, len) };
            return Err(err);
        }
        // SAFETY: as above; the advice only concerns core dumps (failure is harmless).
        unsafe { libc::madvise(addr, len, libc::MADV_DONTDUMP) };
        let ptr = NonNull::new(addr.cast::<T>()).ok_or(libc::ENOMEM)?;
        // SAFETY: the mapping is page-aligned (>= align_of::<T>), writable and at least
        // size_of::<T>() bytes; nothing was there to drop.
        unsafe { ptr.as_ptr().write(value) };
        Ok(LockedBox {
            ptr,
            len,
            _owns: PhantomData,
        })
    }
}

impl<T> std::ops::Deref for LockedBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: ptr holds an initialised T for the box's whole life (written in new,
        // dropped only in drop).
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for LockedBox<T> {
    fn drop(&mut self) {
        let base = self.ptr.as_ptr();
        // SAFETY: base holds the initialised T, dropped exactly once, here; afterwards the
        // whole mapping is plain bytes that this box alone owns, so zeroing it is sound.
        unsafe {
            std::ptr::drop_in_place(base);
            let bytes = std::slice::from_raw_parts_mut(base.cast::<u8>(), self.len);
            zeroize::Zeroize::zeroize(bytes);
            libc::munlock(base.cast(), self.len);
            libc::munmap(base.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_box_holds_its_value() {
        let b = LockedBox::new([7u8; 100]).unwrap();
        assert_eq!(b[99], 7);
    }
}
