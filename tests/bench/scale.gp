# scale.gp: tests/bench/scale.sh's plots from workers.dat and params.dat.
# gnuplot -e "dir='DATA_DIR'; png='PNG_DIR'; note='one line under the plots'" scale.gp
# Each data file holds one block per series (index 0, 1, ...), column 2's
# header its title; columns: x, pushes/s (median over rounds), its min and
# max, push ms, MB/s, bytes per push, the shard's CPU ms per push.
if (!exists("note")) note = ""
set terminal pngcairo size 960,400 font "Sans,9" noenhanced
set grid
set key top left
set bmargin 5
set label 1 note at screen 0.01, screen 0.025 font "Sans,8"

set output png."/scale-workers.png"
set multiplot layout 1,2 title "downpour bench scale: default model (6.65 MB per push), async, shards on loopback"
set logscale x 2
set xrange [0.7:90]
set xlabel "worker processes (no compute)"
set ylabel "pushes/s the shards sustained"
set yrange [0:*]
plot for [i=0:*] dir."/workers.dat" index i using 1:2:3:4 with yerrorlines lw 2 title columnheader(2)
set logscale y
set yrange [*:*]
set ylabel "push latency, median (ms)"
plot for [i=0:*] dir."/workers.dat" index i using 1:5 with linespoints lw 2 title columnheader(2)
unset multiplot

set output png."/scale-params.png"
set multiplot layout 1,2 title "downpour bench scale: 1 shard, as the model grows (one fc layer)"
set logscale xy 10
set xrange [*:*]
set autoscale xfix
set format x "%.0s%c"
set xlabel "parameters (4 bytes each per push)"
set ylabel "pushes/s the shard sustained"
plot for [i=0:*] dir."/params.dat" index i using 1:2:3:4 with yerrorlines lw 2 title columnheader(2)
unset logscale y
set yrange [0:*]
set ylabel "gradient MB/s into the shard"
set key top right
# measured, and what one core of the shard takes: bytes per push / its CPU time per push
plot for [i=0:*] dir."/params.dat" index i using 1:6 with linespoints lw 2 title columnheader(2), \
     for [i=0:*] dir."/params.dat" index i using 1:($7 / 1e3 / $8) with linespoints lw 1 dt 2 \
         title sprintf("per core of the shard (%s)", columnheader(2))
unset multiplot
