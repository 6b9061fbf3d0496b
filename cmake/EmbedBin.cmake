# cmake -DIN=file -DOUT=file.c -DNAME=symbol -DHEADER=h -P EmbedBin.cmake:
# the bytes of IN as const unsigned char NAME[] and its length NAME_len in
# OUT, which includes HEADER (where both are declared). Run at build
# time, so a rebuilt IN rebuilds OUT.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hexlen)
math(EXPR len "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "/* generated from ${NAME}'s program by cmake/EmbedBin.cmake */\n#include \"${HEADER}\"\n\nconst unsigned char ${NAME}[] = {\n${bytes}};\nconst unsigned long ${NAME}_len = ${len}UL;\n")
