# troupe simulate --sweep: end-to-end latency against offered load.
# Run: gnuplot sweep.gp (from this directory)
set terminal pngcairo size 640,480 noenhanced
set output 'sweep.png'
set multiplot layout 1,1
set xlabel 'offered load (requests/s)'
set ylabel 'end-to-end latency (s)'
set logscale y
set grid
set key top left
set title 'layout 4x1x1 (solid: p99, dashed: p50)'
plot '-' using 1:3 with linespoints lc 1 dt 1 title 'latency_aware', '-' using 1:2 with linespoints lc 1 dt 2 notitle, '-' using 1:3 with linespoints lc 2 dt 1 title 'least_outstanding', '-' using 1:2 with linespoints lc 2 dt 2 notitle, '-' using 1:3 with linespoints lc 3 dt 1 title 'power_of_two', '-' using 1:2 with linespoints lc 3 dt 2 notitle, '-' using 1:3 with linespoints lc 4 dt 1 title 'round_robin', '-' using 1:2 with linespoints lc 4 dt 2 notitle
1 2.65291 7.54165
2 3.26942 8.5831
3 3.98932 9.29427
4 5.59532 13.4309
5 8.75562 18.1029
6 10.8983 21.227
e
1 2.65291 7.54165
2 3.26942 8.5831
3 3.98932 9.29427
4 5.59532 13.4309
5 8.75562 18.1029
6 10.8983 21.227
e
1 2.57489 11.1173
2 3.33514 15.1343
3 3.94982 18.2839
4 5.06537 25.3907
5 8.00561 42.1759
6 11.4542 52.497
e
1 2.57489 11.1173
2 3.33514 15.1343
3 3.94982 18.2839
4 5.06537 25.3907
5 8.00561 42.1759
6 11.4542 52.497
e
1 2.76063 13.8379
2 3.40217 16.0654
3 3.98932 21.0169
4 5.21886 27.2222
5 8.41398 43.0236
6 11.3408 54.6286
e
1 2.76063 13.8379
2 3.40217 16.0654
3 3.98932 21.0169
4 5.21886 27.2222
5 8.41398 43.0236
6 11.3408 54.6286
e
1 2.93046 18.4667
2 3.68407 43.4538
3 4.31986 72.1802
4 4.67779 111.83
5 5.53992 111.83
6 8.08567 106.402
e
1 2.93046 18.4667
2 3.68407 43.4538
3 4.31986 72.1802
4 4.67779 111.83
5 5.53992 111.83
6 8.08567 106.402
e
unset multiplot
