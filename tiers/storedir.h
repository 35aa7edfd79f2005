/*
 * storedir.h - folders that hold store files, checked against other users.
 *
 * Shared by fs/ (the meta folder) and tiers/ (nvme and pfs folders). The
 * daemon usually runs as root and writes its store files into folders that
 * users name. Whoever else can write such a folder can put a link or a file
 * of their own under a store file's name, and LMDB opens its files through
 * links. So a folder is used only when no other user can change it: owned
 * by the user the daemon runs as or by root, and writable by neither group
 * nor others. Such a folder stays so while we use it: nobody else can add,
 * remove or rename its entries. A store file in it must be a regular file
 * (not a link, a FIFO or a device), owned the same way, with no access for
 * group or others.
 *
 * `what` names the folder in messages ("meta folder", "nvme folder"). Each
 * function returns 0 (or a descriptor) or -errno, with a message in err
 * that names the folder, the file and the reason.
 */
#ifndef TENSORFS_STOREDIR_H
#define TENSORFS_STOREDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/*
 * Before anything is made: check dir, if it exists, and each of names (a
 * NULL-terminated list) that exists in it. A missing folder passes; it is
 * made 0700 when it is opened.
 */
int storedir_check(const char *what, const char *dir, const char *const *names, char *err,
		   size_t errlen);

/*
 * Open dir as a checked folder and return its descriptor; with make, create
 * it first (0700) when it does not exist, and say so in *made. Files are
 * then opened relative to the descriptor, so what was checked is what is
 * used even if a folder above it is renamed meanwhile.
 */
int storedir_open(const char *what, const char *dir, bool make, bool *made, char *err,
		  size_t errlen);

/* Check entry name of the open folder dirfd, if it exists (absent: 0). */
int storedir_check_file(int dirfd, const char *what, const char *dir, const char *name, char *err,
			size_t errlen);

/*
 * Open store file name in dirfd with flags (O_RDONLY or O_RDWR). With
 * create, a missing file is made with O_EXCL, mode 0600, and *created is
 * set; otherwise a missing file is -ENOENT. Never through a link, never
 * blocking on a FIFO or a device: the file is checked as above before the
 * descriptor is returned, in blocking mode.
 */
int storedir_open_file(int dirfd, const char *what, const char *dir, const char *name, int flags,
		       bool create, bool *created, char *err, size_t errlen);

/* "a folder", "a FIFO", "a symbolic link", ... for a message about a file that is not a regular one */
const char *storedir_file_type(mode_t mode);

#endif
