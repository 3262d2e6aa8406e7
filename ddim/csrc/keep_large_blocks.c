// Large allocations kept for reuse instead of returned to the kernel: loaded with LD_PRELOAD into the process
// that trains or samples (ddim.runtime), in front of glibc's malloc.
//
// Why: XLA:CPU allocates every buffer of a step's temporaries as one block (1.6 GB for a flowers64 training step)
// at each execution and frees it at the end. glibc serves blocks above 32 MB with a fresh mmap and unmaps them on
// free, so every step faults the whole block in again: on a 2-core virtual machine every other step took 0.8-1.0 s
// longer than the 1.8 s a step takes with the block kept (docs/research/cpu-speed.md). This
// layer keeps freed blocks of at least 64 MB mapped and hands them out again to requests of about their size,
// as TensorFlow's and PyTorch's caching allocators do. Everything smaller, and every pointer that is not one of
// its blocks, goes to glibc unchanged.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

// glibc's own entry points (exported for exactly this purpose: wrapping malloc without dlsym, which allocates).
extern void* __libc_malloc(size_t size);
extern void* __libc_realloc(void* pointer, size_t size);
extern void* __libc_memalign(size_t alignment, size_t size);
extern void __libc_free(void* pointer);

enum { kThreshold = 64 << 20, kHugePage = 2 << 20, kSlots = 64, kPageAlignment = 4096 };

typedef struct {
  char* base;
  size_t size;
  int in_use;
  unsigned long long freed_at;  // when it was last freed (a counter): the oldest free block goes first
} Block;

static Block blocks[kSlots];
static size_t in_use_bytes, free_bytes, peak_in_use_bytes;
static unsigned long long clock_ticks;
static uintptr_t lowest = UINTPTR_MAX, highest;  // every block lies in [lowest, highest): free()'s fast test
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void Lock(void) { pthread_mutex_lock(&lock); }
static void Unlock(void) { pthread_mutex_unlock(&lock); }

// A fork while another thread holds the lock would leave it held in the child.
__attribute__((constructor)) static void Init(void) { pthread_atfork(Lock, Unlock, Unlock); }

static int Mine(const void* pointer) {
  uintptr_t address = (uintptr_t)pointer;
  return address >= __atomic_load_n(&lowest, __ATOMIC_ACQUIRE) && address < __atomic_load_n(&highest, __ATOMIC_ACQUIRE);
}

static Block* Find(const void* pointer) {
  for (int i = 0; i < kSlots; ++i)
    if (blocks[i].base == pointer) return &blocks[i];
  return NULL;
}

// Free blocks are kept while they add up to no more than the most ever in use at once: the memory of the
// busiest moment, held once more at most.
static void Trim(void) {
  while (free_bytes > peak_in_use_bytes) {
    Block* oldest = NULL;
    for (int i = 0; i < kSlots; ++i)
      if (blocks[i].base && !blocks[i].in_use && (!oldest || blocks[i].freed_at < oldest->freed_at)) oldest = &blocks[i];
    if (!oldest) return;
    munmap(oldest->base, oldest->size);
    free_bytes -= oldest->size;
    oldest->base = NULL;
  }
}

static void CountInUse(size_t size) {
  in_use_bytes += size;
  if (in_use_bytes > peak_in_use_bytes) peak_in_use_bytes = in_use_bytes;
}

static void* Take(size_t size) {
  Lock();
  Block* best = NULL;
  for (int i = 0; i < kSlots; ++i) {
    Block* b = &blocks[i];
    // A free block at least as large and at most a quarter larger: reuse without wasting much.
    if (b->base && !b->in_use && b->size >= size && b->size - size <= size / 4 && (!best || b->size < best->size))
      best = b;
  }
  if (best) {
    best->in_use = 1;
    free_bytes -= best->size;
    CountInUse(best->size);
    Unlock();
    return best->base;
  }
  Unlock();
  size_t mapped = (size + kHugePage - 1) / kHugePage * kHugePage;
  void* base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return NULL;
  madvise(base, mapped, MADV_HUGEPAGE);  // as glibc.malloc.hugetlb=1 does; ignored where THP is off
  Lock();
  Block* slot = Find(NULL);
  if (!slot) {  // every slot taken: let glibc serve it
    Unlock();
    munmap(base, mapped);
    return __libc_memalign(kPageAlignment, size);
  }
  *slot = (Block){(char*)base, mapped, 1, 0};
  CountInUse(mapped);
  if ((uintptr_t)base < lowest) __atomic_store_n(&lowest, (uintptr_t)base, __ATOMIC_RELEASE);
  if ((uintptr_t)base + mapped > highest) __atomic_store_n(&highest, (uintptr_t)base + mapped, __ATOMIC_RELEASE);
  Trim();
  Unlock();
  return base;
}

// Whether `pointer` was one of the blocks (and is now free).
static int Give(void* pointer) {
  if (!pointer || !Mine(pointer)) return 0;
  Lock();
  Block* b = Find(pointer);
  if (b && b->in_use) {
    b->in_use = 0;
    b->freed_at = ++clock_ticks;
    in_use_bytes -= b->size;
    free_bytes += b->size;
    Trim();
  }
  Unlock();
  return b != NULL;
}

static size_t BlockSize(void* pointer) {
  if (!Mine(pointer)) return 0;
  Lock();
  Block* b = Find(pointer);
  size_t size = b ? b->size : 0;
  Unlock();
  return size;
}

void* malloc(size_t size) { return size >= kThreshold ? Take(size) : __libc_malloc(size); }

void free(void* pointer) {
  if (!Give(pointer)) __libc_free(pointer);
}

void* realloc(void* pointer, size_t size) {
  size_t old = pointer ? BlockSize(pointer) : 0;
  // A glibc block stays with glibc, even growing past the threshold: its size is unknown here.
  if (!old) return pointer ? __libc_realloc(pointer, size) : malloc(size);
  if (size <= old && size >= old - old / 4) return pointer;
  void* moved = malloc(size);
  if (moved) {
    memcpy(moved, pointer, size < old ? size : old);
    free(pointer);
  }
  return moved;
}

int posix_memalign(void** result, size_t alignment, size_t size) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1))) return EINVAL;
  void* pointer = (size >= kThreshold && alignment <= kPageAlignment) ? Take(size) : __libc_memalign(alignment, size);
  if (!pointer) return ENOMEM;
  *result = pointer;
  return 0;
}

void* aligned_alloc(size_t alignment, size_t size) {
  return (size >= kThreshold && alignment <= kPageAlignment) ? Take(size) : __libc_memalign(alignment, size);
}

void* memalign(size_t alignment, size_t size) { return aligned_alloc(alignment, size); }

size_t malloc_usable_size(void* pointer) {
  size_t size = pointer ? BlockSize(pointer) : 0;
  if (size) return size;
  static size_t (*glibc_usable_size)(void*);
  if (!glibc_usable_size) glibc_usable_size = (size_t(*)(void*))dlsym(RTLD_NEXT, "malloc_usable_size");
  return glibc_usable_size(pointer);
}
