//! A read buffer for protocol bytes: filled by `read` calls at its end,
//! consumed by the parser at its front, without zero-filling on every read.
//!
//! Its memory is initialised once and reused; consumed bytes are reclaimed by
//! moving the unconsumed tail to the front only when space runs out.

/// Bytes received but not yet parsed.
#[derive(Debug)]
pub struct ReadBuf {
    data: Vec<u8>,
    head: usize,
    tail: usize,
}

impl ReadBuf {
    /// A buffer with `capacity` bytes of room to start with.
    pub fn with_capacity(capacity: usize) -> ReadBuf {
        ReadBuf { data: vec![0; capacity.max(64)], head: 0, tail: 0 }
    }

    /// The unconsumed bytes.
    pub fn filled(&self) -> &[u8] {
        &self.data[self.head..self.tail]
    }

    /// Number of unconsumed bytes.
    pub fn len(&self) -> usize {
        self.tail - self.head
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Drops `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        assert!(n <= self.len(), "consume past the end of the buffer");
        self.head += n;
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        }
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.head = 0;
        self.tail = 0;
    }

    /// Room for at least `min` more bytes at the end, to read into; call
    /// [`ReadBuf::commit`] with the number of bytes actually read.
    pub fn spare(&mut self, min: usize) -> &mut [u8] {
        if self.data.len() - self.tail < min {
            if self.head > 0 {
                self.data.copy_within(self.head..self.tail, 0);
                self.tail -= self.head;
                self.head = 0;
            }
            if self.data.len() - self.tail < min {
                let want = (self.tail + min).max(self.data.len() * 2);
                self.data.resize(want, 0);
            }
        }
        &mut self.data[self.tail..]
    }

    /// Marks `n` bytes of the spare room as filled.
    pub fn commit(&mut self, n: usize) {
        assert!(self.tail + n <= self.data.len(), "commit past the spare room");
        self.tail += n;
    }

    /// Gives back memory after a burst (e.g. one huge value) once it is consumed.
    pub fn shrink_to(&mut self, capacity: usize) {
        if self.is_empty() && self.data.len() > capacity * 4 {
            self.data = vec![0; capacity.max(64)];
            self.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReadBuf;

    #[test]
    fn fills_consumes_compacts_and_grows() {
        let mut b = ReadBuf::with_capacity(64);
        let room = b.spare(10);
        room[..5].copy_from_slice(b"hello");
        b.commit(5);
        assert_eq!(b.filled(), b"hello");
        b.consume(2);
        assert_eq!(b.filled(), b"llo");
        let room = b.spare(100);
        assert!(room.len() >= 100);
        room[..3].copy_from_slice(b"abc");
        b.commit(3);
        assert_eq!(b.filled(), b"lloabc");
        b.consume(6);
        assert!(b.is_empty());
        b.shrink_to(16);
        assert_eq!(b.len(), 0);
    }
}
