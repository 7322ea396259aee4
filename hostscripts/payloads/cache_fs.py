# Root's file operations under a model cache (and under the stack's own folder), and the only
# ones: the payloads that write, remove or rename there as root (model_verify.py on every node
# with the node's python3, model_sync.py in the stack's image, model_ref.py on the head) carry
# this text in front of their own (hostscripts/models.py joins them) and touch no file but
# through a Tree.
#
# Why (issue 46): the Hugging Face cache is written by containers (the fetch and sync mount its
# hub/ read-write; another stack naming the same cache does too) and a /home/<user> cache by
# that user, so any name in it may be a symbolic link planted to make root truncate, overwrite
# or remove a file elsewhere (shown on the lab: `refs/main` linked to a file on the head, whose
# content became the commit hash on the next `up`). A Tree opens its root from `/` one
# component at a time, and every path below it relative to the folder's descriptor, each
# component with O_NOFOLLOW: a symbolic link anywhere on the way, a component that is not a
# folder (or, at the end, not a regular file), or one owned by anyone but root or the user the
# command runs as is refused, naming the path (Refused), and nothing is written there. A file is
# written as a new file in its folder (O_EXCL) renamed over its name, never opened in place; a
# snapshot link is replaced as a link, never followed. A root under /home/<user> is refused unless <user> is
# the user the command runs as (the node's ssh user), as the node's own passwd says.
# The lines above are not sent to the node.

import errno, os, pwd, re, stat


class Refused(Exception):
    pass


_OWNERS = {0, os.getuid()}
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(mode):
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def _owned(st, path):
    if st.st_uid not in _OWNERS:
        raise Refused("%s is owned by uid %d, not by root or the user this runs as (uid %d)"
                      % (path, st.st_uid, os.getuid()))


def _opendir(dirfd, name, path, create, mode):
    """The folder `name` in `dirfd`, never through a link; made (`mode`) when `create`."""
    for attempt in (0, 1):
        try:
            fd = os.open(name, _DIR, dir_fd=dirfd)
            break
        except FileNotFoundError:
            if not create or attempt:
                raise
            try:
                os.mkdir(name, mode, dir_fd=dirfd)
            except FileExistsError:
                pass
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = os.lstat(name, dir_fd=dirfd)
            raise Refused("%s is %s, not a folder: refused, nothing was written there"
                          % (path, _kind(st.st_mode)))
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused("%s is not a folder" % path)
        _owned(st, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parts(rel, path):
    parts = rel.split("/") if rel else []
    if any(p in ("", ".", "..") for p in parts):
        raise Refused("%s is not a normalised path below its root" % path)
    return parts


class Tree:
    """A folder that root changes only through these methods: `root` opened from `/`, and every
    path below it (relative, normalised) opened from its folder's descriptor, no link followed."""

    def __init__(self, root, create=False, mode=0o755):
        if not root.startswith("/") or os.path.normpath(root) != root:
            raise Refused("%s is not a normalised absolute path" % root)
        self.root, self.mode = root.rstrip("/") or "/", mode
        home = re.match(r"/home/([^/]+)(/|$)", self.root)
        if home:
            try:
                uid = pwd.getpwnam(home.group(1)).pw_uid
            except KeyError:
                raise Refused("%s is in the home of %s, who is no user of this node"
                              % (self.root, home.group(1)))
            if uid != os.getuid():
                raise Refused("%s is in the home of %s (uid %d), who is not the user this runs "
                              "as (uid %d, the node's ssh user): that user could plant links "
                              "there for root to follow" % (self.root, home.group(1), uid,
                                                             os.getuid()))
        fd = os.open("/", _DIR)
        try:
            _owned(os.fstat(fd), "/")
            path = ""
            for part in _parts(self.root.lstrip("/"), self.root):
                path += "/" + part
                nfd = _opendir(fd, part, path, create, mode)
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def path(self, rel):
        return self.root + ("/" + rel if rel else "")

    def dir(self, rel, create=False):
        """A descriptor of the folder `rel` (the caller closes it)."""
        fd = os.dup(self.fd)
        path = self.root
        try:
            for part in _parts(rel, self.path(rel)):
                path += "/" + part
                nfd = _opendir(fd, part, path, create, self.mode)
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _parent(self, rel, create=False):
        parts = _parts(rel, self.path(rel))
        if not parts:
            raise Refused("%s: no file name" % self.path(rel))
        return self.dir("/".join(parts[:-1]), create), parts[-1]

    def lstat(self, rel):
        """What `rel` is (never through a link), or None when it is not there."""
        try:
            fd, name = self._parent(rel)
        except FileNotFoundError:
            return None
        try:
            return os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def file(self, rel):
        """`rel`'s stat when it is a regular file of root's or the user's, None when it is not
        there; Refused when it is anything else (a link, a folder)."""
        st = self.lstat(rel)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise Refused("%s is %s, not a regular file: refused, nothing was changed there"
                          % (self.path(rel), _kind(st.st_mode)))
        _owned(st, self.path(rel))
        return st

    def open(self, rel, flags, create=False, mode=0o644):
        """A descriptor of the regular file `rel` (O_NOFOLLOW: a link is refused)."""
        fd, name = self._parent(rel, create)
        try:
            try:
                f = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC
                            | (os.O_CREAT if create else 0), mode, dir_fd=fd)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise Refused("%s is a symbolic link: refused, nothing was changed there"
                              % self.path(rel))
        finally:
            os.close(fd)
        try:
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode):
                raise Refused("%s is %s, not a regular file" % (self.path(rel),
                                                               _kind(st.st_mode)))
            _owned(st, self.path(rel))
        except BaseException:
            os.close(f)
            raise
        return f

    def write(self, rel, data, mode=0o644):
        """`rel` holds `data`: a new file in its folder, renamed over the name (never written
        through). Anything but a regular file of root's or the user's at the name is refused."""
        fd, name = self._parent(rel, True)
        tmp = ".%s.spark-vllm-new" % name
        try:
            self._regular_or_none(fd, name, self.path(rel))
            try:
                os.unlink(tmp, dir_fd=fd)  # a leftover (or a planted name): never opened
            except FileNotFoundError:
                pass
            f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        mode, dir_fd=fd)
            try:
                os.write(f, data)
                os.fsync(f)
            finally:
                os.close(f)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        finally:
            os.close(fd)

    def remove(self, rel):
        """The regular file `rel` removed (True), or nothing there (False); Refused for a link
        or a folder."""
        if self.file(rel) is None:
            return False
        fd, name = self._parent(rel)
        try:
            os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
        return True

    def rename(self, src, dst):
        """The regular file `src` renamed to `dst` (a regular file there is replaced; anything
        else refused)."""
        if self.file(src) is None:
            raise Refused("%s is gone" % self.path(src))
        sfd, sname = self._parent(src)
        try:
            dfd, dname = self._parent(dst, True)
            try:
                self._regular_or_none(dfd, dname, self.path(dst))
                os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

    def symlink(self, rel, target):
        """`rel` is a link to `target` (a link or a file there is replaced; a folder refused)."""
        fd, name = self._parent(rel, True)
        try:
            st = self._at(fd, name)
            if st is not None:
                if stat.S_ISDIR(st.st_mode):
                    raise Refused("%s is a folder, not a link: refused" % self.path(rel))
                os.unlink(name, dir_fd=fd)
            os.symlink(target, name, dir_fd=fd)
        finally:
            os.close(fd)

    def readlink(self, rel):
        """Where the link `rel` points (read, never followed), or None when `rel` is not one."""
        st = self.lstat(rel)
        if st is None or not stat.S_ISLNK(st.st_mode):
            return None
        fd, name = self._parent(rel)
        try:
            return os.readlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    @staticmethod
    def _regular_or_none(fd, name, path):
        st = Tree._at(fd, name)
        if st is not None:
            if not stat.S_ISREG(st.st_mode):
                raise Refused("%s is %s, not a regular file: refused, nothing was written there"
                              % (path, _kind(st.st_mode)))
            _owned(st, path)

    @staticmethod
    def _at(fd, name):
        try:
            return os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            return None
