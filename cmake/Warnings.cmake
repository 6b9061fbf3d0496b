# The one place that holds the warning set; every target calls it.
option(CQ_WERROR "Treat warnings as errors (CI sets this)" OFF)

function(cq_target_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wformat=2 -Wstrict-prototypes
    -Wmissing-prototypes -Wvla -Wwrite-strings -Wcast-qual
    -Wnull-dereference -Wundef
    $<$<BOOL:${CQ_WERROR}>:-Werror>)
endfunction()
