# Regenerates the .npz fixtures used by tests/test_data.cpp (numpy 1.24, Python 3.11):
#   cd tests/data && /usr/bin/python3 make_fixtures.py
import io, struct, zipfile, zlib
import numpy as np

x = (np.arange(18, dtype=np.float32).reshape(6, 3) * 0.5 - 1.0)  # (6, 3)
y = np.array([0, 1, 2, 0, 1, 2], dtype=np.int64)

np.savez("good.npz", x=x, y=y)
xc = np.tile(x, (10, 1))  # (60, 3): enough to make deflate worthwhile
yc = np.tile(y, 10)
np.savez_compressed("good_compressed.npz", x=xc, y=yc)
np.savez("x_float64.npz", x=x.astype(np.float64), y=y)
np.savez("y_int32.npz", x=x, y=y.astype(np.int32))
np.savez("missing_y.npz", x=x, labels=y)
np.savez("mismatched_n.npz", x=x, y=y[:5])
np.savez("negative_label.npz", x=x, y=np.array([0, 1, -1, 0, 1, 2], dtype=np.int64))
np.savez("x_1d.npz", x=x[:, 0].copy(), y=y)
np.savez("fortran.npz", x=np.asfortranarray(x), y=y)
good = open("good.npz", "rb").read()
open("truncated.npz", "wb").write(good[: len(good) // 2])
open("not_a_zip.npz", "w").write("x,y\n1.0,0\n")

def npy(arr, version):
    f = io.BytesIO()
    np.lib.format.write_array(f, arr, version=version)
    return f.getvalue()

# bzip2 members: a zip method (12) that np.load reads but dtlab does not.
with zipfile.ZipFile("bzip2.npz", "w", compression=zipfile.ZIP_BZIP2) as z:
    z.writestr("x.npy", npy(x, (1, 0)))
    z.writestr("y.npy", npy(y, (1, 0)))

# Two members named x.npy (zipfile warns, np.load takes the last one): ambiguous, so refused.
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with zipfile.ZipFile("duplicate_x.npz", "w") as z:
        z.writestr("x.npy", npy(x, (1, 0)))
        z.writestr("y.npy", npy(y, (1, 0)))
        z.writestr("x.npy", npy(x * 2, (1, 0)))

# 64 spiral-like rows with one NaN (row 41): with --batch 16 --world 2 and no shuffle it is in rank 1's
# second batch, so training must stop at step 2 naming rank 1 and its input.
xn = np.stack([np.cos(np.arange(64) * 0.3), np.sin(np.arange(64) * 0.3)], axis=1).astype(np.float32)
xn[41, 1] = np.nan
np.savez("nan_x.npz", x=xn, y=(np.arange(64) % 3).astype(np.int64))

# 30 rows with x[0][0] = +inf (tests/test_nonfinite.cpp): mlp:2,4,3 with seed 0 hides it from the loss.
xi = xn[:30].copy()  # rows 0..29: the NaN is in row 41
xi[0, 0] = np.inf
np.savez("inf_x.npz", x=xi, y=(np.arange(30) % 3).astype(np.int64))

# x's data cut short inside a valid zip (CRC matches): the .npy body is truncated.
with zipfile.ZipFile("x_short.npz", "w") as z:
    z.writestr("x.npy", npy(x, (1, 0))[:-8])
    z.writestr("y.npy", npy(y, (1, 0)))

# Hand-written ZIP64 archive: every size and offset in the central directory is 0xFFFFFFFF with a
# zip64 extra field, a ZIP64 end record and locator, .npy versions 2.0 and 3.0, and an archive comment.
def zip64(members, comment):
    out, central = bytearray(), bytearray()
    for name, data, method in members:
        payload = data if method == 0 else zlib.compress(data, 9)[2:-4]  # raw deflate
        crc, off, nm = zlib.crc32(data), len(out), name.encode()
        extra = struct.pack("<HHQQ", 1, 16, len(data), len(payload))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, method, 0, 0x21, crc,
                           0xFFFFFFFF, 0xFFFFFFFF, len(nm), len(extra)) + nm + extra + payload
        cextra = struct.pack("<HHQQQ", 1, 24, len(data), len(payload), off)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, method, 0, 0x21, crc,
                               0xFFFFFFFF, 0xFFFFFFFF, len(nm), len(cextra), 0, 0, 0, 0,
                               0xFFFFFFFF) + nm + cextra
    cd_off, n = len(out), len(members)
    out += central
    z64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_off)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF,
                       len(comment)) + comment
    return bytes(out)

open("zip64_v2v3.npz", "wb").write(zip64(
    [("x.npy", npy(x, (2, 0)), 8), ("y.npy", npy(y, (3, 0)), 0)], b"dtlab fixture"))

for f in ["good.npz", "good_compressed.npz", "zip64_v2v3.npz"]:
    d = np.load(f)
    assert (d["x"][:6] == x).all() and (d["y"][:6] == y).all(), f
